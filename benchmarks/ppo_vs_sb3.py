"""polar PPO vs Stable-Baselines3 PPO on CartPole-v1, side by side in one run.

Same setup for both: RL Zoo's CartPole hyperparameters (8 envs, n_steps 32, batch 256, 20 epochs,
gamma 0.98, gae_lambda 0.8, ent_coef 0, lr linear from 1e-3, clip linear from 0.2, schedules over
100k steps), the same network (separate 64-64 tanh actor and critic, SB3's MlpPolicy), one torch
thread, no TensorBoard, no progress bar. Trials alternate polar / SB3 per seed, each in a fresh
process, so both see the same machine load.

Measured:
- time to 475: wall-clock from the trial process's start (parent's clock before spawning it,
  so interpreter start-up and imports count) until the mean return of the last 100 training
  episodes is >= 475 (window must be full). Both sides check the window once per rollout, after it,
  and stop the clock after that rollout's update (polar's trainer reports per iteration; SB3's callback
  is made to do the same, so neither counts env steps at a finer grain);
- env steps to 475: the env steps of the rollouts so far at that point; the two sides' samples are
  compared with a two-sided Mann-Whitney U test (scipy; a run that never reached 475 ranks last) when
  each side has 5 seeds or more, printed under the table and written to ``--out``'s JSON
  (``env_steps_to_target``);
- CPU time to 475: user+sys CPU seconds of the trial process at that point (steadier than wall
  time on a shared machine: it does not count time spent waiting for a core);
- training env steps/s: env steps at that point / time since training started;
- rollout throughput: env steps/s of the untrained policy through each framework's collector,
  as a fraction of raw ``gymnasium.vector.SyncVectorEnv`` steps/s with random actions (same N), by wall
  clock and by CPU time (steps per CPU second of the process: steadier on a shared box);
  and on EnvPool (when installed): polar's collector on ``harness: {type: envpool}`` and a CleanRL-style
  rollout (``benchmarks/cleanrl_ppo_envpool.py``), as fractions of raw EnvPool steps/s with random
  actions (same N, one synchronous pool, EnvPool's default threads).

    .venv/bin/pip install -e '.[bench]'
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ppo_vs_sb3.py --seeds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 475.0
TOTAL = 100_000
MIN_SEEDS_FOR_TEST = 5  # a rank test on fewer runs a side cannot reach p < 0.05 (3 vs 3: 0.1 at best)
ZOO = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0)

POLAR_TRIAL = r"""
import json, sys, time, tempfile
seed, budget = int(sys.argv[1]), int(sys.argv[2])
from polar.config import load_config
from polar.trainers.build import build_trainer
from polar.trainers.run_dir import RunDir
cfg = load_config(sys.argv[3], [f"seed={seed}", "logging.tensorboard=false", "logging.checkpoint_freq=0",
                                "logging.progress_bar=false", "eval.at_end=false", f"total_env_steps={budget}"])
import resource
hit = {}
def on_iteration(m):
    if not hit and m["episodes"] >= 100 and m["episode_reward_mean"] is not None and m["episode_reward_mean"] >= 475:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        hit.update(t=time.time(), steps=m["env_steps"], cpu=ru.ru_utime + ru.ru_stime)
t_train = time.time()
res = build_trainer(cfg, RunDir.create("bench", tempfile.mkdtemp()), on_iteration=on_iteration).train()
print(json.dumps({"t_train": t_train, "t_hit": hit.get("t"), "steps": hit.get("steps"), "cpu": hit.get("cpu"),
                  "final_steps": res["env_steps"]}))
"""

SB3_TRIAL = r"""
import json, resource, sys, time
seed, budget = int(sys.argv[1]), int(sys.argv[2])
import numpy as np, torch
torch.set_num_threads(1)
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
hit = {}
class Stop(BaseCallback):  # checks the window once per rollout, as polar's trainer does; clocked after its update
    def _on_rollout_end(self):
        buf = self.model.ep_info_buffer
        if not hit and len(buf) >= 100 and np.mean([e["r"] for e in buf]) >= 475:
            hit["steps"] = self.num_timesteps
    def _clock(self):
        if "steps" in hit and "t" not in hit:
            ru = resource.getrusage(resource.RUSAGE_SELF)
            hit.update(t=time.time(), cpu=ru.ru_utime + ru.ru_stime)
    def _on_rollout_start(self):  # train() of the rollout that reached it is done
        self._clock()
    def _on_training_end(self):  # reached in the budget's last rollout
        self._clock()
    def _on_step(self):
        return "t" not in hit
def lin(x):
    return lambda p: p * x
env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=lin(1e-3), clip_range=lin(0.2), device="cpu", seed=seed, verbose=0)
t_train = time.time()
model.learn(total_timesteps=budget, callback=Stop())
print(json.dumps({"t_train": t_train, "t_hit": hit.get("t"), "steps": hit.get("steps"), "cpu": hit.get("cpu"),
                  "final_steps": model.num_timesteps}))
"""

THROUGHPUT = r"""
import json, sys, time
import numpy as np, torch, gymnasium as gym
torch.set_num_threads(1)
which, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if which == "raw":
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    env.reset(seed=0)
    acts = np.random.default_rng(0).integers(0, 2, size=(steps, n))
    for i in range(200): env.step(acts[i])
    t, c = time.perf_counter(), time.process_time()
    for i in range(steps): env.step(acts[i])
    dt, dc = time.perf_counter() - t, time.process_time() - c
elif which == "raw_envpool":
    import envpool
    env = envpool.make_gymnasium("CartPole-v1", num_envs=n, batch_size=n, seed=0)
    env.reset()
    acts = np.random.default_rng(0).integers(0, 2, size=(steps, n))
    for i in range(200): env.step(acts[i])
    t, c = time.perf_counter(), time.process_time()
    for i in range(steps): env.step(acts[i])
    dt, dc = time.perf_counter() - t, time.process_time() - c
elif which == "cleanrl_envpool":
    sys.path.insert(0, "benchmarks")
    from cleanrl_ppo_envpool import rollout_throughput
    steps = (steps // 250) * 250
    dt, dc = rollout_throughput(n, steps, 250)
elif which in ("polar", "polar_envpool"):
    from polar.config import RunConfig, validate
    from polar.harness import make_vector_env
    from polar.models import build_policy
    from polar.rollout.runner import EnvRunner
    harness = "envpool" if which == "polar_envpool" else "gymnasium"
    cfg = validate(RunConfig, {"harness": {"type": harness, "id": "CartPole-v1"}, "policy": {"type": "ppo"}})
    env = make_vector_env(cfg.harness, n, seed=0)
    runner = EnvRunner(env, build_policy(cfg, env.single_observation_space, env.single_action_space), seed=0)
    runner.collect(200)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps // 250): runner.collect(250)
    dt, dc = time.perf_counter() - t, time.process_time() - c
    steps = (steps // 250) * 250
else:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.env_util import make_vec_env
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=n, seed=0), n_steps=250, batch_size=250, device="cpu", verbose=0)
    model._setup_learn(total_timesteps=10**9)
    cb = CallbackList([]); cb.init_callback(model)
    model.collect_rollouts(model.env, cb, model.rollout_buffer, n_rollout_steps=250)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps // 250): model.collect_rollouts(model.env, cb, model.rollout_buffer, n_rollout_steps=250)
    dt, dc = time.perf_counter() - t, time.process_time() - c
    steps = (steps // 250) * 250
print(json.dumps({"sps": steps * n / dt, "cpu_sps": steps * n / dc}))  # CPU: robust to waiting for a core
"""


def _run(code: str, args: list, timeout: float = 900) -> tuple[dict, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"trial failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1]), t0


def time_to_target(which: str, seed: int) -> dict:
    code = POLAR_TRIAL if which == "polar" else SB3_TRIAL
    out, t0 = _run(code, [seed, TOTAL, ROOT / "examples" / "cartpole_ppo.yaml"])
    if out["t_hit"] is None:
        return {"seed": seed, "reached": False, "wall_s": float("inf"), "cpu_s": float("inf"), "steps": out["final_steps"],
                "train_sps": None}
    return {"seed": seed, "reached": True, "wall_s": out["t_hit"] - t0, "cpu_s": out["cpu"], "steps": out["steps"],
            "train_sps": out["steps"] / (out["t_hit"] - out["t_train"])}


def mann_whitney_p(a: list[dict], b: list[dict]) -> float:
    """Two-sided Mann-Whitney U p-value of two sides' env steps to the target (a run that missed it ranks last)."""
    from scipy.stats import mannwhitneyu  # the bench extra

    def steps(rs: list[dict]) -> list[float]:
        return [r["steps"] if r["reached"] else float("inf") for r in rs]

    return float(mannwhitneyu(steps(a), steps(b), alternative="two-sided").pvalue)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--repeats", type=int, default=3, help="throughput repeats")
    ap.add_argument("--envs", type=int, nargs="+", default=[8, 64], help="env counts for the throughput rows")
    ap.add_argument("--steps", type=int, default=3000, help="vector steps per throughput measurement")
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true", help="only the time-to-475 trials")
    ap.add_argument("--out", type=Path, default=None, help="also write all raw results as JSON here")
    args = ap.parse_args()

    results: dict = {"polar": [], "sb3": [], "throughput": {}}
    if not args.skip_training:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for which in ("polar", "sb3") if seed % 2 == 0 else ("sb3", "polar"):
                r = time_to_target(which, seed)
                r["load"] = os.getloadavg()[0]
                results[which].append(r)
                print(f"  {which:5s} seed {seed}: {r['wall_s']:.2f}s ({r['cpu_s']:.1f} CPU s) to {TARGET:.0f} at {r['steps']} steps "
                      f"(load {r['load']:.1f})", file=sys.stderr, flush=True)
                if args.out:  # a cut-short run keeps its trials
                    args.out.write_text(json.dumps(results, indent=2, default=str))
    try:
        import envpool  # noqa: F401
        kinds = ["raw", "polar", "sb3", "raw_envpool", "polar_envpool", "cleanrl_envpool"]
    except ImportError:
        kinds = ["raw", "polar", "sb3"]
    for n in [] if args.skip_throughput else args.envs:
        rows: dict[str, list[float]] = {k: [] for k in kinds}
        cpu_rows: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(args.repeats):
            for which in rows:
                out = _run(THROUGHPUT, [which, n, args.steps])[0]
                rows[which].append(out["sps"])
                cpu_rows[which].append(out["cpu_sps"])
        results.setdefault("cpu_throughput", {})[n] = cpu_rows
        results["throughput"][n] = rows
        print(f"  throughput N={n}: " + ", ".join(f"{k} {med(v):,.0f}" for k, v in rows.items()), file=sys.stderr)

    print()
    if not args.skip_training:
        p, s = results["polar"], results["sb3"]
        pw, sw = med([r["wall_s"] for r in p]), med([r["wall_s"] for r in s])
        print(f"CartPole-v1 to mean return {TARGET:.0f} (100-episode window), {args.seeds} seeds "
              f"({args.first_seed}-{args.first_seed + args.seeds - 1}), median [min-max]")
        print(f"{'':28s}{'polar':>22s}{'SB3':>22s}{'polar/SB3':>11s}")

        def row(name, get, fmt):  # a run that never reached the target counts as inf (None: left out)
            a = [v for v in map(get, p) if v is not None]
            b = [v for v in map(get, s) if v is not None]
            cell = lambda xs: f"{fmt(med(xs))} [{fmt(min(xs))}-{fmt(max(xs))}]" if xs else "n/a"  # noqa: E731
            print(f"{name:28s}{cell(a):>22s}{cell(b):>22s}{med(a) / med(b):>11.2f}")

        never = lambda fmt: lambda x: "never" if x == float("inf") else fmt(x)  # noqa: E731
        row("wall s from process start", lambda r: r["wall_s"], never(lambda x: f"{x:.1f}"))
        row("CPU s from process start", lambda r: r["cpu_s"], never(lambda x: f"{x:.1f}"))
        row("env steps at 475", lambda r: r["steps"] if r["reached"] else float("inf"), never(lambda x: f"{x / 1000:.1f}k"))
        row("training env steps/s", lambda r: r["train_sps"], lambda x: f"{x:,.0f}")
        print(f"reached: polar {sum(r['reached'] for r in p)}/{len(p)}, SB3 {sum(r['reached'] for r in s)}/{len(s)}; "
              f"target polar <= 0.25x SB3 wall: {'MET' if pw <= 0.25 * sw else 'NOT MET'} ({pw / sw:.2f}x)")
        steps = lambda rs: [r["steps"] if r["reached"] else float("inf") for r in rs]  # noqa: E731
        ps, ss = med(steps(p)), med(steps(s))
        pvalue = mann_whitney_p(p, s) if min(len(p), len(s)) >= MIN_SEEDS_FOR_TEST else None
        results["env_steps_to_target"] = {"polar_median": ps, "sb3_median": ss, "ratio": ps / ss,
                                          "mann_whitney_p": pvalue, "runs": [len(p), len(s)]}
        test = (f"two-sided Mann-Whitney U p = {pvalue:.3f}" if pvalue is not None
                else f"no Mann-Whitney U test under {MIN_SEEDS_FOR_TEST} seeds a side")
        print(f"env steps to {TARGET:.0f}: polar/SB3 medians {ps / ss:.2f}x; {test} ({len(p)} vs {len(s)} runs)")
        print()
        if args.out:
            args.out.write_text(json.dumps(results, indent=2, default=str))
    if args.skip_throughput:
        return
    print("Rollout throughput, untrained policy (env steps/s, median of repeats)")
    print(f"{'N envs':>7s}{'raw SyncVectorEnv':>19s}{'polar':>10s}{'polar/raw':>11s}{'SB3':>10s}{'SB3/raw':>9s}"
          f"{'polar/raw CPU':>15s}")
    for n, rows in results["throughput"].items():
        raw, po, sb = med(rows["raw"]), med(rows["polar"]), med(rows["sb3"])
        cpu = results["cpu_throughput"][n]  # steps per CPU second: what waiting for a core does not change
        print(f"{n:>7d}{raw:>19,.0f}{po:>10,.0f}{po / raw:>11.2f}{sb:>10,.0f}{sb / raw:>9.2f}"
              f"{med(cpu['polar']) / med(cpu['raw']):>15.2f}")
    if "raw_envpool" in kinds:
        print("\nOn EnvPool (env steps/s, median of repeats)")
        print(f"{'N envs':>7s}{'raw EnvPool':>13s}{'polar':>10s}{'polar/raw':>11s}{'CleanRL-style':>15s}"
              f"{'CleanRL/raw':>13s}{'polar/SyncVectorEnv':>21s}")
        for n, rows in results["throughput"].items():
            raw, po, cr, sync = (med(rows[k]) for k in ("raw_envpool", "polar_envpool", "cleanrl_envpool", "raw"))
            print(f"{n:>7d}{raw:>13,.0f}{po:>10,.0f}{po / raw:>11.2f}{cr:>15,.0f}{cr / raw:>13.2f}{po / sync:>21.2f}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
