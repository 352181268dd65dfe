"""Instructions per vector step (valgrind's callgrind): polar's collector and raw ``SyncVectorEnv`` stepping.

    OMP_NUM_THREADS=1 PYTHONPATH=<a polar tree> .venv/bin/python benchmarks/rollout_instructions.py --envs 8

Instruction counts do not move with the load of a shared box (CPU seconds do, by 10-30% here), so two trees
compare to a percent. Each side runs in its own ``valgrind --tool=callgrind --instr-atstart=no`` process; the
child switches instrumentation on (``callgrind_control -i on``) only around the measured region: for ``raw``
and ``raw_same_step``, ``ppo_vs_sb3.py``'s raw stepping (pre-drawn random actions, Gymnasium's default
NEXT_STEP autoreset, or SAME_STEP as polar's vector envs) after 200 warm-up steps; for ``polar_env``, the same
stepping of polar's own vector env (``make_vector_env``: SAME_STEP, no policy); for ``polar``, ``EnvRunner.collect``
of the untrained PPO policy on CartPole-v1 after ``collect(200)``. Under valgrind a run takes minutes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("raw", "raw_same_step", "polar_env", "polar")


def child(kind: str, n: int, fragments: int) -> None:
    import gymnasium as gym
    import numpy as np
    import torch

    torch.set_num_threads(1)
    if kind == "polar":
        from polar.config import RunConfig, validate
        from polar.harness import make_vector_env
        from polar.models import build_policy
        from polar.rollout.runner import EnvRunner

        cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"}})
        env = make_vector_env(cfg.harness, n, seed=0)
        runner = EnvRunner(env, build_policy(cfg, env.single_observation_space, env.single_action_space), seed=0)
        runner.collect(200)

        def run() -> None:
            for _ in range(fragments):
                runner.collect(250)
    else:
        if kind == "polar_env":
            from polar.config.harness import GymnasiumHarnessConfig
            from polar.harness import make_vector_env

            venv = make_vector_env(GymnasiumHarnessConfig(id="CartPole-v1"), n)
        else:
            mode = gym.vector.AutoresetMode.SAME_STEP if kind == "raw_same_step" else gym.vector.AutoresetMode.NEXT_STEP
            venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)], autoreset_mode=mode)
        venv.reset(seed=0)
        acts = np.random.default_rng(0).integers(0, 2, size=(200 + 250 * fragments, n))
        for i in range(200):
            venv.step(acts[i])

        def run() -> None:
            for i in range(200, 200 + 250 * fragments):
                venv.step(acts[i])
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
    run()
    subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)


def instructions_per_step(kind: str, n: int, fragments: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p",
                        sys.executable, __file__, "--child", kind, "--envs", str(n), "--fragments", str(fragments)],
                       check=True, capture_output=True, timeout=3600)
        total = 0  # each part's "totals:" (its "summary:" reads 0 when instrumentation starts off)
        for f in Path(tmp).glob("callgrind.out.*"):
            total += sum(int(line.split()[1]) for line in f.read_text().splitlines() if line.startswith("totals:"))
    return total / (250 * fragments)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--fragments", type=int, default=2, help="250-step fragments (raw: as many steps) measured")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.envs, args.fragments)
        return
    ir = {k: instructions_per_step(k, args.envs, args.fragments) for k in args.kinds}
    print(f"N={args.envs} instructions per vector step: " + ", ".join(f"{k} {v / 1e3:,.0f}k" for k, v in ir.items()))
    if "raw" in ir and "polar" in ir:
        print(f"raw/polar {ir['raw'] / ir['polar']:.3f}")


if __name__ == "__main__":
    main()
