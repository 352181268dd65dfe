"""Where a rollout step's CPU goes in polar's ``EnvRunner``, beside raw ``SyncVectorEnv`` stepping in the same process.

    OMP_NUM_THREADS=1 PYTHONPATH=<a polar tree> .venv/bin/python benchmarks/rollout_cpu_breakdown.py --envs 8

The untrained PPO policy on CartPole-v1 (as ``ppo_vs_sb3.py``'s rollout table), ``collect(200)`` to warm up.
Per round, one after the other in this process: raw ``SyncVectorEnv`` stepping with pre-drawn random actions
(``ppo_vs_sb3.py``'s "raw": Gymnasium's default NEXT_STEP autoreset, no policy), the same with SAME_STEP
autoreset (what polar's vector envs do: the final observation comes with the step that ends an episode), polar's
``collect`` over 8 fragments of 250 steps, and again with ``env.step`` and the runner's numpy acting call wrapped
in ``time.process_time()`` accumulators (env / act / rest; acting includes setting up a fragment's
actor). Best of ``--rounds``; CPU time, not wall: waiting
for a core on a shared box does not count. ``polar/raw`` is the CPU-second ratio of ``ppo_vs_sb3.py``'s table,
both sides measured in one run. Run it with ``PYTHONPATH`` at two trees to compare commits.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

from polar.config import RunConfig, validate
from polar.harness import make_vector_env
from polar.models import build_policy
from polar.rollout.runner import EnvRunner

STEPS = 2000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = args.envs
    torch.set_num_threads(1)
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"}})
    env = make_vector_env(cfg.harness, n, seed=0)
    runner = EnvRunner(env, build_policy(cfg, env.single_observation_space, env.single_action_space), seed=0)
    runner.collect(200)
    fast_act, env_step = runner.fast_act, env.step
    make_actor = getattr(runner, "rollout_actor", None)  # trees before it act through fast_act each step
    if fast_act is None:
        raise SystemExit("this runner acts through act (not the numpy path): nothing to break down")
    raw = {mode: gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)], autoreset_mode=mode)
           for mode in (gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP)}
    acts = np.random.default_rng(0).integers(0, 2, size=(STEPS, n))
    for e in raw.values():
        e.reset(seed=0)
        for i in range(200):
            e.step(acts[i])
    acc = {"act": 0.0, "step": 0.0}

    def timed_step(a):
        t = time.process_time()
        out = env_step(a)
        acc["step"] += time.process_time() - t
        return out

    def timed(fn):
        def call(*a, **kw):
            t = time.process_time()
            out = fn(*a, **kw)
            acc["act"] += time.process_time() - t
            return out
        return call

    def timed_actor(num_steps, num_envs):  # setting the fragment's actor up counts as acting
        t = time.process_time()
        actor = make_actor(num_steps, num_envs)
        acc["act"] += time.process_time() - t
        return timed(actor)

    def cpu(fn) -> float:
        t = time.process_time()
        fn()
        return (time.process_time() - t) * 1e6 / STEPS  # us per vector step

    def raw_steps(e):
        return lambda: [e.step(acts[i]) for i in range(STEPS)]

    def collect():
        for _ in range(STEPS // 250):
            runner.collect(250)

    best: dict[str, float] = {}
    split = None
    for _ in range(args.rounds):
        for name, e in zip(("raw", "raw_same_step"), raw.values(), strict=True):
            best[name] = min(best.get(name, float("inf")), cpu(raw_steps(e)))
        best["polar"] = min(best.get("polar", float("inf")), cpu(collect))
        env.step, runner.fast_act = timed_step, timed(fast_act)
        if make_actor is not None:
            runner.rollout_actor = timed_actor
        acc["act"] = acc["step"] = 0.0
        total = cpu(collect)
        env.step, runner.fast_act = env_step, fast_act
        if make_actor is not None:
            runner.rollout_actor = make_actor
        row = (total, acc["step"] * 1e6 / STEPS, acc["act"] * 1e6 / STEPS)
        split = row if split is None or row[0] < split[0] else split
    assert split is not None
    total, step, act = split
    print(f"N={n} CPU us per vector step: raw {best['raw']:.1f} (SAME_STEP {best['raw_same_step']:.1f}), "
          f"polar {best['polar']:.1f}; polar/raw {best['raw'] / best['polar']:.3f} "
          f"(SAME_STEP raw/raw {best['raw'] / best['raw_same_step']:.3f})")
    print(f"N={n} timed split: total {total:.1f}, env {step:.1f}, act {act:.1f}, rest {total - step - act:.1f}; "
          f"env / total {step / total:.3f}")


if __name__ == "__main__":
    main()
