"""The fused PPO path's share of time-to-475 on CartPole-v1: ``policy.kwargs.fused: auto`` vs ``off``.

``fused: auto`` (the default) runs two hand-written twins for the built-in MLP: ``fused_step`` (the
hand-derived gradient, in place of ``autograd_step``) and numpy acting (``act_numpy``, in place of
``act``). ``fused: off`` runs the torch code a user edits. This measures what that costs a whole run, not
one update (``benchmarks/ppo_update_paths.py`` does that): CPU seconds of the trial process, interpreter
start-up and imports included, until the mean return of the last 100 training episodes reaches 475
(checked once per rollout, after its update; the run then stops through ``stop_reward``).

Two configs: polar's defaults (``policy: {type: ppo}``: 8 envs, 1,024-sample rollouts, 160 gradient
steps each) and RL Zoo's tuned one (``examples/cartpole_ppo.yaml``, the config of ``ppo_vs_sb3.py``).
Per seed both settings run in fresh processes, alternating which goes first, so they see the same load.
CPU time rather than wall time: the machine may be shared. One torch thread.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ppo_fused_share.py --seeds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 475.0
CONFIGS = {
    "default": (ROOT / "benchmarks" / "configs" / "cartpole_ppo_default.yaml", 400_000),  # every kwarg at its default
    "rl_zoo": (ROOT / "examples" / "cartpole_ppo.yaml", 100_000),
}

TRIAL = r"""
import json, resource, sys, tempfile, time
import torch
torch.set_num_threads(1)
config, setting, seed, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
from polar.config import load_config
from polar.trainers.build import build_trainer
from polar.trainers.run_dir import RunDir
overrides = [f"seed={seed}", "logging.tensorboard=false", "logging.checkpoint_freq=0", "logging.progress_bar=false",
             "eval.at_end=false", f"total_env_steps={budget}", f"stop_reward={TARGET}",
             f'policy.kwargs.fused="{setting}"']
cfg = load_config(config, overrides)
hit = {}
paths = []
def on_iteration(m):
    if not hit and m["episodes"] >= 100 and m["episode_reward_mean"] is not None and m["episode_reward_mean"] >= TARGET:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        hit.update(cpu=ru.ru_utime + ru.ru_stime, steps=m["env_steps"], t=time.time())
import logging
class Grab(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("PPO update path"):
            paths.append(record.getMessage())
logging.getLogger("polar.algorithms.ppo").addHandler(Grab())
logging.getLogger("polar.algorithms.ppo").setLevel(logging.INFO)
res = build_trainer(cfg, RunDir.create("bench", tempfile.mkdtemp()), on_iteration=on_iteration).train()
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": hit.get("cpu"), "steps": hit.get("steps"), "final_steps": res["env_steps"],
                  "total_cpu": ru.ru_utime + ru.ru_stime, "path": paths[0] if paths else None}))
""".replace("TARGET", repr(TARGET))


def trial(config: str, setting: str, seed: int, budget: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", TRIAL, config, setting, str(seed), str(budget)], capture_output=True,
                       text=True, timeout=3600, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{config} fused={setting} seed {seed} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    expected = "fused" if setting == "auto" else "autograd"
    if not (out["path"] or "").startswith(f"PPO update path: {expected}"):
        raise RuntimeError(f"fused={setting} ran {out['path']!r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--out", type=Path, default=None, help="append every trial as a JSON line here")
    args = ap.parse_args()
    rows: dict[tuple[str, str], list[dict]] = {}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for name in args.configs:
            path, budget = CONFIGS[name]
            for setting in ("auto", "off") if seed % 2 == 0 else ("off", "auto"):
                r = trial(str(path), setting, seed, budget)
                r.update(config=name, fused=setting, seed=seed, load=os.getloadavg()[0])
                rows.setdefault((name, setting), []).append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps(r) + "\n")
    print(f"\nCPU seconds to a 100-episode mean of {TARGET:.0f} on CartPole-v1, median [min-max] of "
          f"{args.seeds} seeds ({os.cpu_count()} CPUs)")
    print(f"{'config':10s}{'fused: auto':>24s}{'fused: off':>24s}{'off/auto':>10s}{'fused share':>13s}")
    for name in args.configs:
        cells, meds = [], []
        for setting in ("auto", "off"):
            cpu = [r["cpu"] for r in rows[(name, setting)] if r["cpu"] is not None]
            missed = len(rows[(name, setting)]) - len(cpu)
            meds.append(statistics.median(cpu) if cpu else float("nan"))
            cells.append(f"{meds[-1]:.1f} [{min(cpu):.1f}-{max(cpu):.1f}]" + (f" ({missed} missed)" if missed else "")
                         if cpu else "never")
        print(f"{name:10s}{cells[0]:>24s}{cells[1]:>24s}{meds[1] / meds[0]:>10.2f}{1 - meds[0] / meds[1]:>13.0%}")


if __name__ == "__main__":
    main()
