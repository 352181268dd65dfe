"""polar before vs after a change, side by side in one run on the same box: PPO, DQN/SAC and the gateway.

Each side is a git worktree; its own ``benchmarks/*.py`` run its own ``polar`` (``PYTHONPATH`` points at
the tree, so ``import polar`` resolves there, in the trial subprocesses too). Per repeat, and per
benchmark, the two sides alternate order (before, after / after, before), so both see the same load:

- ``ppo``: ``benchmarks/ppo_vs_sb3.py``'s polar trial (RL Zoo CartPole config, wall and CPU seconds from
  process start to a 100-episode mean of 475, env steps/s while training; seed = repeat index) and its
  rollout throughput row (8 envs, untrained policy);
- ``off_policy``: ``benchmarks/off_policy_vs_sb3.py``'s polar trials (DQN CartPole 50k steps, SAC
  Pendulum 10k steps; wall/CPU seconds, gradient steps/s, eval return);
- ``gateway``: ``benchmarks/gateway_overhead.py --concurrency 1`` (polar's p50 latency and req/s
  through the gateway next to the direct upstream, in the same script run).

The SB3/LiteLLM sides of those scripts are the same code before and after, so they are not rerun here;
their ratios to polar are in the sections of docs/benchmarks.md they come from.

    git worktree add /tmp/before 65d9e93 && git worktree add /tmp/after HEAD
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/before_after.py --before /tmp/before --after /tmp/after --repeats 3
    git worktree remove /tmp/before && git worktree remove /tmp/after
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(tree: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_{abs(hash(str(tree)))}", tree / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _use(tree: Path) -> None:
    os.environ["PYTHONPATH"] = str(tree)  # the trial subprocesses inherit it
    p = subprocess.run([sys.executable, "-c", "import polar; print(polar.__file__)"], capture_output=True, text=True,
                       check=True, env=os.environ, cwd=tree)  # the trials run in their tree too (sys.path[0])
    if not p.stdout.strip().startswith(str(tree)):
        raise SystemExit(f"import polar resolves to {p.stdout.strip()}, not under {tree}")


def bench_ppo(tree: Path, seed: int) -> dict:
    mod = _load(tree, "ppo_vs_sb3")
    r = mod.time_to_target("polar", seed)
    sps = mod._run(mod.THROUGHPUT, ["polar", 8, 3000])[0]["sps"]
    return {"wall_s_to_475": r["wall_s"], "cpu_s_to_475": r["cpu_s"], "steps_at_475": r["steps"],
            "train_env_sps": r["train_sps"], "rollout_sps_8envs": sps}


def bench_off_policy(tree: Path, seed: int) -> dict:
    mod = _load(tree, "off_policy_vs_sb3")
    out = {}
    for workload in ("dqn", "sac"):
        r = mod.run_trial("polar", workload, seed, mod.WORKLOADS[workload]["steps"], 1, 3600)
        out.update({f"{workload}_wall_s": r["wall_s"], f"{workload}_cpu_s": r["cpu_s"],
                    f"{workload}_grad_sps": r["grad_sps"], f"{workload}_eval": r["eval_mean"]})
    return out


def bench_gateway(tree: Path, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gw.json"
        p = subprocess.run([sys.executable, str(tree / "benchmarks" / "gateway_overhead.py"), "--concurrency", "1",
                            "--requests", "1000", "--skip-litellm", "--out", str(out)], capture_output=True, text=True,
                           timeout=1800, cwd=tree, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if p.returncode != 0:
            raise RuntimeError(f"gateway_overhead.py in {tree} failed ({p.returncode}):\n{p.stderr[-3000:]}")
        rows = {r["target"]: r for r in json.loads(out.read_text())["results"]}
    polar, direct = rows["polar"], rows["direct"]
    return {"gateway_rps": polar["rps"], "gateway_p50_ms": polar["p50_ms"], "gateway_p99_ms": polar["p99_ms"],
            "gateway_overhead_p50_ms": polar["p50_ms"] - direct["p50_ms"], "direct_p50_ms": direct["p50_ms"]}


BENCHES = {"ppo": bench_ppo, "off_policy": bench_off_policy, "gateway": bench_gateway}
HIGHER_IS_BETTER = ("sps", "rps", "eval")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="worktree of the commit before")
    ap.add_argument("--after", type=Path, default=ROOT, help="worktree of the commit after (default: this checkout)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    ap.add_argument("--out", type=Path, default=None, help="append every measurement as a JSON line here")
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    rows: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    loads: list[float] = []
    for rep in range(args.repeats):
        for name in args.only:
            for side in ("before", "after") if rep % 2 == 0 else ("after", "before"):
                _use(trees[side])
                t = time.time()
                try:
                    res = BENCHES[name](trees[side], rep)
                except Exception as e:  # one failed trial is reported, the rest still run
                    print(f"rep {rep} {name} {side} FAILED: {str(e)[-1500:]}", file=sys.stderr, flush=True)
                    continue
                loads.append(os.getloadavg()[0])
                print(f"rep {rep} {name:10s} {side:6s} ({time.time() - t:.0f} s, load {loads[-1]:.1f}): "
                      + ", ".join(f"{k} {v:.4g}" for k, v in res.items() if v is not None), file=sys.stderr, flush=True)
                for k, v in res.items():
                    rows[side].setdefault(k, []).append(v)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps({"rep": rep, "bench": name, "side": side, "load": loads[-1], **res}) + "\n")
    print(f"\npolar after / before, median of {args.repeats} (interleaved); load average "
          f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    print(f"{'metric':26s}{'before':>12s}{'after':>12s}{'after/before':>14s}  better")
    for k, before in rows["before"].items():
        b = statistics.median(x for x in before if x is not None)
        if not rows["after"].get(k):
            continue
        a = statistics.median(x for x in rows["after"][k] if x is not None)
        better = "higher" if any(s in k for s in HIGHER_IS_BETTER) else "lower"
        print(f"{k:26s}{b:>12.4g}{a:>12.4g}{a / b if b else float('nan'):>14.3f}  {better}")


if __name__ == "__main__":
    main()
