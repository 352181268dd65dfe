"""Where a rollout step's CPU goes in polar's ``EnvRunner``: the env step, the acting call, the rest of the loop.

    OMP_NUM_THREADS=1 PYTHONPATH=<a polar tree> .venv/bin/python benchmarks/rollout_cpu_breakdown.py --envs 8

The untrained PPO policy on CartPole-v1 (as ``ppo_vs_sb3.py``'s rollout table), ``collect(200)`` to warm up,
then ``env.step`` and the runner's numpy acting call wrapped in ``time.process_time()`` accumulators over 8
fragments of 250 steps; best of 5. CPU time, not wall: waiting for a core on a shared box does not count.
``env / total`` bounds polar/raw by CPU. Run it with ``PYTHONPATH`` at two trees to compare commits.
"""

from __future__ import annotations

import argparse
import time

import torch

from polar.config import RunConfig, validate
from polar.harness import make_vector_env
from polar.models import build_policy
from polar.rollout.runner import EnvRunner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, default=8)
    n = ap.parse_args().envs
    torch.set_num_threads(1)
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"}})
    env = make_vector_env(cfg.harness, n, seed=0)
    runner = EnvRunner(env, build_policy(cfg, env.single_observation_space, env.single_action_space), seed=0)
    runner.collect(200)
    fast_act, env_step = runner.fast_act, env.step
    if fast_act is None:
        raise SystemExit("this runner acts through act (not the numpy path): nothing to break down")
    acc = {"act": 0.0, "step": 0.0}

    def timed_step(a):
        t = time.process_time()
        out = env_step(a)
        acc["step"] += time.process_time() - t
        return out

    def timed_act(obs):
        t = time.process_time()
        out = fast_act(obs)
        acc["act"] += time.process_time() - t
        return out

    env.step, runner.fast_act = timed_step, timed_act
    best = None
    for _ in range(5):
        acc["act"] = acc["step"] = 0.0
        t = time.process_time()
        for _ in range(8):
            runner.collect(250)
        row = (time.process_time() - t, acc["step"], acc["act"])
        best = row if best is None or row[0] < best[0] else best
    total, step, act = best
    us = 1e6 / 2000
    print(f"N={n} CPU us per vector step: total {total * us:.0f}, env {step * us:.0f}, act {act * us:.0f}, "
          f"rest {(total - step - act) * us:.0f}; env / total {step / total:.2f}")


if __name__ == "__main__":
    main()
