"""polar's rollout throughput at two commits, interleaved in one run: polar/raw of ``ppo_vs_sb3.py``'s table.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rollout_before_after.py --before REF [--after REF|PATH] \\
        [--envs 8 64] [--repeats 5]

Each measurement is ``ppo_vs_sb3.py``'s throughput code (this checkout's) in a fresh process, with
``PYTHONPATH`` set to one side's tree: the untrained PPO policy through ``EnvRunner`` on CartPole-v1, and raw
``SyncVectorEnv`` stepping with random actions beside it. Per repeat the order alternates (raw, before,
after / raw, after, before) so both sides see the same load. Printed: median polar/raw per side by wall
clock and by CPU time (steps per CPU second, which waiting for a core does not change), and after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo_vs_sb3 import ROOT, THROUGHPUT


def tree(ref: str, tmp: Path) -> Path:
    if Path(ref).is_dir():
        return Path(ref).resolve()
    path = tmp / ref.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(path), ref], check=True)
    return path


def measure(which: str, path: Path, n: int, steps: int) -> tuple[float, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(path))
    p = subprocess.run([sys.executable, "-c", THROUGHPUT, which, str(n), str(steps)], capture_output=True, text=True,
                       env=env, cwd=path, timeout=900, check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return out["sps"], out["cpu_sps"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default=str(ROOT))
    ap.add_argument("--envs", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"before": tree(args.before, Path(tmp)), "after": tree(args.after, Path(tmp))}
        try:
            print(f"before {args.before}, after {args.after}; load {os.getloadavg()[0]:.1f}", file=sys.stderr)
            print(f"{'N envs':>7s}{'before wall':>13s}{'after wall':>12s}{'after/before':>14s}"
                  f"{'before CPU':>12s}{'after CPU':>11s}{'after/before':>14s}")
            for n in args.envs:
                ratio: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
                for r in range(args.repeats):
                    raw = measure("raw", sides["after"], n, args.steps)
                    for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                        po = measure("polar", sides[side], n, args.steps)
                        ratio[side].append((po[0] / raw[0], po[1] / raw[1]))
                b = [statistics.median(x[k] for x in ratio["before"]) for k in (0, 1)]
                a = [statistics.median(x[k] for x in ratio["after"]) for k in (0, 1)]
                print(f"{n:>7d}{b[0]:>13.2f}{a[0]:>12.2f}{a[0] / b[0]:>14.2f}{b[1]:>12.2f}{a[1]:>11.2f}{a[1] / b[1]:>14.2f}",
                      flush=True)
            print(f"load at the end {os.getloadavg()[0]:.1f}", file=sys.stderr)
        finally:
            for path in sides.values():
                if str(path).startswith(tmp):
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


if __name__ == "__main__":
    main()
