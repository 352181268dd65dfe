"""polar PPO's *default* kwargs vs Stable-Baselines3 PPO's defaults, side by side in one run.

Nothing is tuned on either side: polar runs ``policy: {type: ppo}`` with no kwargs and its default
agent (separate 64-64 tanh actor and critic); SB3 runs ``PPO("MlpPolicy" | "MultiInputPolicy", env)``
with no arguments but the seed and ``device="cpu"``. Each side runs with 1 env and with 8 envs
(polar: ``distribution.envs_per_worker``, envs stepped in the learner; SB3: ``make_vec_env(n_envs=...)``,
a ``DummyVecEnv``), 3 seeds each, every trial in a fresh process, one torch thread. The two connector
games with crashes also run polar in the seed document's layout, 2 rollout worker processes x 4 envs
(``distribution: {rollout_workers: 2, envs_per_worker: 4}``).

Envs: CartPole-v1, Acrobot-v1, FrozenLake-v1 (8x8, is_slippery=True), and through connectors (polar as
``harness.type: custom``; SB3 through polar's ``ConnectorEnv``, the connector as one ``gymnasium.Env``, one
connector process per env copy):

- ``keydoor``: the key-door game (level 1, 7x7 grid) of ``examples/keydoor``;
- ``keydoor-crash``: the same game, each copy killing its connector process with probability 1/5000 per
  step (both libraries restart it; the episodes it hosted end as truncated);
- ``corridor-crash``: the connector written the way the seed document writes one
  (``tests/harness/connectors/seed_shaped.py``: 4-tuple ``step``, randomness and crashes from
  ``config["seed"]``, crash probability 1/2000 per step), a 7-cell corridor: issue 38's case.

How the return is measured, identically on both sides: a recorder inside every env copy
(``benchmarks/_defaults_recorder.py``) writes each finished training episode's return and the total env
steps of all copies at that moment (each copy counts its steps in a shared file that outlives a crashed
connector process). Episodes are ordered by that step count; "the return" at a point is the mean return
of the last W finished training episodes (W per env, below; the window must be full).

- steps to target: the first total env step at which that mean reaches the env's target;
- wall s to target: wall clock from just before the trial process is spawned (so interpreter start,
  imports and env/connector start-up count) to that episode's end;
- final return: that mean over the last W episodes finished within the budget.

The table shows the median over seeds (a trial that never reaches the target counts as infinitely
slow; the median is "-" when most seeds miss).

    .venv/bin/pip install -e '.[bench]'
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/defaults_vs_sb3.py --out defaults.json
    .venv/bin/python benchmarks/defaults_vs_sb3.py --from-json defaults.json      # the table again
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# target: the return both sides are timed to; window: episodes averaged; budget: env steps per trial.
ENVS: dict[str, dict] = {
    "CartPole-v1": {"target": 195.0, "window": 20, "budget": 50_000, "kwargs": {}},
    "Acrobot-v1": {"target": -120.0, "window": 20, "budget": 50_000, "kwargs": {}},
    "FrozenLake-v1": {"target": 0.1, "window": 100, "budget": 150_000,
                      "kwargs": {"map_name": "8x8", "is_slippery": True}},
    "keydoor": {"target": 0.8, "window": 100, "budget": 30_000, "kwargs": {"level": 1}, "connector": "RecordingKeyDoor"},
    # the seed's game and layout: key-door level 1 through a connector that crashes now and then, polar with
    # 2 rollout workers x 4 envs (and 1 x 8 in the learner)
    "keydoor-crash": {"target": 0.8, "window": 100, "budget": 40_000, "kwargs": {"level": 1, "crash_every": 5000},
                      "connector": "RecordingKeyDoor",
                      "runs": [("polar", 1, 0), ("polar", 8, 0), ("polar", 8, 2), ("sb3", 1, 0), ("sb3", 8, 0)]},
    # the case: the seed-shaped corridor connector (crashes now and then), the seed's layout
    "corridor-crash": {"target": 0.95, "window": 100, "budget": 15_000, "kwargs": {"crash_prob": 0.0005},
                       "connector": "RecordingCorridor", "config_seed": True,  # its only randomness: config.seed
                       "runs": [("polar", 1, 0), ("polar", 8, 0), ("polar", 8, 2), ("sb3", 1, 0), ("sb3", 8, 0)]},
}
# (side, env copies, polar's rollout workers: 0 = the copies are stepped in the learner, K = K workers x copies/K)
RUNS = [("polar", 1, 0), ("polar", 8, 0), ("sb3", 1, 0), ("sb3", 8, 0)]


def env_runs(name: str) -> list[tuple[str, int, int]]:
    return [tuple(r) for r in ENVS[name].get("runs", RUNS)]  # type: ignore[misc]


def run_label(side: str, n: int, workers: int) -> str:
    if side == "sb3":
        return f"SB3 defaults, {n} env{'s' if n > 1 else ''}"
    if workers:
        return f"polar defaults, {workers} workers x {n // workers} envs"
    return f"polar defaults, {n} env{'s' if n > 1 else ''}"

TRIAL = r"""
import json, sys, time
side, env_name, n_envs, seed, budget, record_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
env_kwargs, polar_kwargs, workers, connector_cls = json.loads(sys.argv[7]), json.loads(sys.argv[8]), int(sys.argv[9]), sys.argv[10]
import torch
torch.set_num_threads(1)
import _defaults_recorder  # registers defaults_rec/<id>
keydoor = bool(connector_cls)  # a connector game: polar harness.type custom, SB3 through ConnectorEnv
connector = {"module": "_defaults_recorder", "class_name": connector_cls,
             "config": {**env_kwargs, "record_dir": record_dir, "crash_seed": seed}}
t_train = time.time()
if side == "polar":
    import tempfile
    from polar.config import RunConfig, validate
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir
    harness = ({"type": "custom", "connector_spec": connector} if keydoor else
               {"type": "gymnasium", "id": f"_defaults_recorder:defaults_rec/{env_name}",
                "kwargs": {**env_kwargs, "record_dir": record_dir}})
    cfg = validate(RunConfig, {
        "harness": harness, "policy": {"type": "ppo", "kwargs": polar_kwargs},
        "distribution": {"rollout_workers": workers, "envs_per_worker": n_envs // max(1, workers)},
        "total_env_steps": budget, "seed": seed,
        "logging": {"tensorboard": False, "checkpoint_freq": 0, "progress_bar": False}, "eval": {"at_end": False}})
    cfg._config_dir = __import__("pathlib").Path(_defaults_recorder.__file__).parent
    t_train = time.time()
    res = build_trainer(cfg, RunDir.create("bench", tempfile.mkdtemp())).train()
    final_steps = res["env_steps"]
else:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    if keydoor:
        import itertools
        from polar.config.harness import ConnectorSpec
        from polar.harness.connector.vector_env import ConnectorEnv
        copy_ids = itertools.count()  # one name per copy: its recorder and crash stream survive restarts
        def make_copy():
            i = next(copy_ids)
            config = {**connector["config"], "copy_id": i}
            if "seed" in config:  # each copy its own seed, as polar derives one per copy from config.seed
                config["seed"] = 1000 * config["seed"] + i
            spec = ConnectorSpec.model_validate({**connector, "config": config})
            return ConnectorEnv(spec, config_dir=__import__("pathlib").Path(_defaults_recorder.__file__).parent)
        env = make_vec_env(make_copy, n_envs=n_envs, seed=seed)
        policy = "MultiInputPolicy"
    else:
        env = make_vec_env(f"defaults_rec/{env_name}", n_envs=n_envs, seed=seed,
                           env_kwargs={**env_kwargs, "record_dir": record_dir})
        policy = "MlpPolicy"
    model = PPO(policy, env, seed=seed, device="cpu", verbose=0)
    t_train = time.time()
    model.learn(total_timesteps=budget)
    final_steps = model.num_timesteps
    env.close()
print(json.dumps({"t_train": t_train, "final_steps": final_steps}))
"""


def run_trial(side: str, env_name: str, n_envs: int, seed: int, budget: int, polar_kwargs: dict,
              workers: int = 0) -> dict:
    """One training run in a fresh process; returns its episodes as ``[total env steps, return, t - t0]``."""
    spec = ENVS[env_name]
    kwargs = {**spec["kwargs"], "seed": seed} if spec.get("config_seed") else spec["kwargs"]
    with tempfile.TemporaryDirectory() as record_dir:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(BENCH), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        t0 = time.time()
        p = subprocess.run([sys.executable, "-c", TRIAL, side, env_name, str(n_envs), str(seed), str(budget), record_dir,
                            json.dumps(kwargs), json.dumps(polar_kwargs), str(workers),
                            spec.get("connector", "")],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"{side} {env_name} x{n_envs} ({workers} workers) seed {seed} failed ({p.returncode}):\n{p.stderr[-3000:]}")
        out = json.loads(p.stdout.strip().splitlines()[-1])
        episodes = []
        for f in Path(record_dir).glob("*.jsonl"):
            for line in f.read_text().splitlines():
                _, ret, t, total = json.loads(line)
                episodes.append([total, ret, t - t0])
    episodes.sort()
    return {"side": side, "env": env_name, "n_envs": n_envs, "workers": workers, "seed": seed, "budget": budget,
            "wall_s": time.time() - t0, "train_start_s": out["t_train"] - t0, "final_steps": out["final_steps"],
            "episodes": episodes}


def summarize(trial: dict, target: float, window: int, budget: int) -> dict:
    """Steps and wall s to the target within ``budget`` env steps (None when not reached), and the final
    windowed return at ``budget`` (a longer trial is cut there: both sides' defaults use constant schedules)."""
    eps = [e for e in trial["episodes"] if e[0] <= budget]
    hit_steps = hit_s = None
    total = 0.0
    for i, (steps, ret, t) in enumerate(eps):
        total += ret
        if i >= window:
            total -= eps[i - window][1]
        if i + 1 >= window and total / window >= target:
            hit_steps, hit_s = steps, t
            break
    last = [e[1] for e in eps[-window:]]
    final = sum(last) / len(last) if len(last) == window else float("nan")
    return {"steps": hit_steps, "wall_s": hit_s, "final": final}


def median_or_none(xs: list) -> float | None:
    """Median with misses as +inf; None when the median itself is a miss."""
    m = statistics.median([math.inf if x is None else x for x in xs])
    return None if math.isinf(m) else m


def table(trials: list[dict], envs: list[str]) -> str:
    lines = ["| env (target, window W, budget) | run | reached | env steps to target | wall s to target | "
             "final return (last W eps) |", "|---|---|---:|---:|---:|---:|"]
    verdicts = []
    for name in envs:
        spec = ENVS[name]
        best_sb3 = math.inf
        polar_steps = {}
        for side, n, workers in env_runs(name):
            rows = [summarize(t, spec["target"], spec["window"], min(spec["budget"], t["budget"])) for t in trials
                    if t["env"] == name and t["side"] == side and t["n_envs"] == n and t.get("workers", 0) == workers]
            if not rows:
                continue
            st, ws = median_or_none([r["steps"] for r in rows]), median_or_none([r["wall_s"] for r in rows])
            fin = statistics.median([r["final"] for r in rows])
            reached = sum(r["steps"] is not None for r in rows)
            label = run_label(side, n, workers)
            head = f"{name} (>= {spec['target']:g}, W={spec['window']}, {spec['budget'] // 1000}k)"
            lines.append(f"| {head} | {label} | {reached}/{len(rows)} | "
                         f"{'-' if st is None else f'{st:,.0f}'} | {'-' if ws is None else f'{ws:.1f}'} | {fin:.3f} |")
            if side == "sb3":
                best_sb3 = min(best_sb3, math.inf if st is None else st)
            else:
                polar_steps[(n, workers)] = math.inf if st is None else st
        if polar_steps and not math.isinf(best_sb3):
            ok = all(s <= best_sb3 for s in polar_steps.values())
            verdicts.append(f"{name}: polar {'/'.join(f'{s:,.0f}' for s in polar_steps.values())} vs best SB3 "
                            f"{best_sb3:,.0f} steps -> {'MET' if ok else 'NOT MET'}")
    return "\n".join(lines) + "\n\n" + "\n".join(verdicts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    ap.add_argument("--runs", nargs="+", default=None,
                    help="side:n_envs[:workers] to run (default: each env's runs: polar and SB3 at 1 and 8 envs, "
                         "and polar's 2 workers x 4 envs where the env lists it)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=1, help="trials run at once (each is one process, one thread)")
    ap.add_argument("--polar-kwargs", type=json.loads, default={},
                    help="JSON policy.kwargs for polar (default {}: the defaults being benchmarked)")
    ap.add_argument("--budget", type=int, default=None, help="override every env's budget (env steps)")
    ap.add_argument("--budget-scale", type=float, default=1.0,
                    help="run each trial this many times its env's budget (the table still cuts at the budget)")
    ap.add_argument("--out", type=Path, default=None, help="write every trial's episodes as JSON here")
    ap.add_argument("--from-json", type=Path, nargs="+", default=None, help="print the table from earlier --out files")
    args = ap.parse_args()

    if args.from_json:
        trials = [t for p in args.from_json for t in json.loads(p.read_text())["trials"]]
        print(table(trials, [e for e in ENVS if any(t["env"] == e for t in trials)]))
        return
    chosen = None if args.runs is None else [[*r.split(":"), "0"][:3] for r in args.runs]
    jobs = []
    for name in args.envs:
        runs = env_runs(name) if chosen is None else [(s, int(n), int(w)) for s, n, w in chosen]
        for seed in args.seeds:  # alternate the order per seed: both sides see the same load
            jobs += [(side, name, n, w, seed) for side, n, w in (runs if seed % 2 == 0 else runs[::-1])]
    trials: list[dict] = []
    lock = threading.Lock()

    def one(job):
        side, name, n, workers, seed = job
        budget = args.budget or int(ENVS[name]["budget"] * args.budget_scale)
        t = run_trial(side, name, n, seed, budget, args.polar_kwargs if side == "polar" else {}, workers)
        s = summarize(t, ENVS[name]["target"], ENVS[name]["window"], budget)
        print(f"  {name:14s} {side:5s} x{n}/{workers}w seed {seed}: {t['wall_s']:6.1f}s, target at {s['steps']} steps "
              f"({s['wall_s'] and round(s['wall_s'], 1)} s), final {s['final']:.3f} (load {os.getloadavg()[0]:.1f})",
              file=sys.stderr, flush=True)
        with lock:
            trials.append(t)
            if args.out:
                args.out.write_text(json.dumps({"polar_kwargs": args.polar_kwargs, "trials": trials}))

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, jobs))
    print(table(trials, args.envs))


if __name__ == "__main__":
    main()
