"""PPO's deterministic work per iteration, before vs after a change: function calls, not seconds.

On a loaded shared box CPU seconds move by 10% from run to run; call counts do not. Each side is a
git worktree (``PYTHONPATH`` points at it, as in ``benchmarks/before_after.py``). For each side the
default CartPole PPO config (``examples/cartpole_ppo.yaml``, seed 0, 8 envs in the learner, no
TensorBoard/checkpoints/progress bar/final eval) trains ``--iters`` and ``2 x --iters`` iterations
under cProfile; the difference of the two, divided by ``--iters``, is the work of one steady-state
iteration (start-up and the first iterations cancel out):

- Python function calls per iteration (every call cProfile sees in the main thread);
- torch/numpy C calls per iteration (kernels and tensor methods: matmuls, tanh, in-place Adam, ...);
- the functions whose per-iteration call count differs between the sides.

    git worktree add /tmp/before 65d9e93 && git worktree add /tmp/after HEAD
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ppo_work_per_iteration.py --before /tmp/before --after /tmp/after
"""

from __future__ import annotations

import argparse
import os
import pstats
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRIAL = r"""
import cProfile, sys, tempfile
from polar.config import load_config
from polar.trainers.build import build_trainer
from polar.trainers.run_dir import RunDir
cfg = load_config("examples/cartpole_ppo.yaml", ["seed=0", "logging.tensorboard=false", "logging.checkpoint_freq=0",
                  "logging.progress_bar=false", "eval.at_end=false", f"total_env_steps={sys.argv[1]}"])
trainer = build_trainer(cfg, RunDir.create("bench", tempfile.mkdtemp()))
prof = cProfile.Profile()
prof.enable()
trainer.train()
prof.disable()
prof.dump_stats(sys.argv[2])
"""


def _profile(tree: Path, env_steps: int, out: Path) -> dict[str, int]:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", TRIAL, str(env_steps), str(out)], cwd=tree, env=env, check=True,
                   capture_output=True, timeout=3600)
    counts: dict[str, int] = {}
    for (path, _, name), (_, ncalls, *_rest) in pstats.Stats(str(out)).stats.items():  # type: ignore[attr-defined]
        key = name if path == "~" else f"{re.sub(r'^.*/(polar|site-packages)/', '', path)}:{name}"
        key = re.sub(r" at 0x[0-9a-f]+", "", key)
        counts[key] = counts.get(key, 0) + ncalls
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="worktree of the commit before")
    ap.add_argument("--after", type=Path, default=ROOT, help="worktree of the commit after (default: this checkout)")
    ap.add_argument("--iters", type=int, default=40, help="iterations of the shorter run (the longer runs twice as many)")
    args = ap.parse_args()
    steps = 256 * args.iters  # the config's rollout: 8 envs x n_steps 32
    per: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side, tree in (("before", args.before.resolve()), ("after", args.after.resolve())):
            short = _profile(tree, steps, Path(tmp) / f"{side}-1.prof")
            long = _profile(tree, 2 * steps, Path(tmp) / f"{side}-2.prof")
            per[side] = {k: (long.get(k, 0) - short.get(k, 0)) / args.iters for k in set(short) | set(long)}

    def c_calls(d: dict[str, float]) -> float:
        return sum(v for k, v in d.items() if ":" not in k and ("torch" in k or "numpy" in k))

    b, a = per["before"], per["after"]
    print(f"PPO CartPole (examples/cartpole_ppo.yaml), per steady-state iteration ({args.iters} -> {2 * args.iters} iterations)")
    print(f"{'':34s}{'before':>10s}{'after':>10s}{'after/before':>14s}")
    for name, fb, fa in (("Python + C calls (cProfile)", sum(b.values()), sum(a.values())),
                         ("torch/numpy C calls", c_calls(b), c_calls(a))):
        print(f"{name:34s}{fb:>10.1f}{fa:>10.1f}{fa / fb:>14.4f}")
    diff = sorted(((a.get(k, 0) - b.get(k, 0), k) for k in set(a) | set(b)), key=lambda t: -abs(t[0]))
    print("\nper-iteration call counts that differ (after - before):")
    for d, k in diff:
        if abs(d) >= 0.5:
            print(f"  {d:+8.1f}  {k}")


if __name__ == "__main__":
    main()
