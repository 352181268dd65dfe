"""polar DQN / SAC vs Stable-Baselines3 DQN / SAC, side by side in one run.

Two workloads, each with RL Zoo's tuned hyperparameters, set identically on both sides from one dict
below (polar gets them as ``-o policy.kwargs.*`` overrides of the example YAML, SB3 as constructor
arguments; everything else is each library's default, and polar's defaults follow SB3's):

- ``dqn``: DQN on CartPole-v1 (``examples/cartpole_dqn.yaml``; lr 2.3e-3, batch 64, buffer 100k,
  learning_starts 1000, target_update_interval 10, train_freq 256, gradient_steps 128, epsilon
  1 -> 0.04 over 16% of training, 256-256 ReLU Q-network), 50k env steps per trial;
- ``sac``: SAC on Pendulum-v1 (``examples/pendulum_sac.yaml``; lr 1e-3, the rest SB3 defaults:
  batch 256, buffer 1M, learning_starts 100, tau 0.005, one gradient step per env step, ent_coef
  auto, 256-256 ReLU actor and twin critics), 10k env steps per trial by default (RL Zoo trains
  20k, ``--sac-steps 20000``; SAC does one gradient step per env step, so it is the slow workload).

One env, ``--threads`` torch threads (default 1) on both sides, no TensorBoard, no progress bar, no
replay-buffer checkpoint. Trials alternate polar / SB3 per seed, each in a fresh process, so both see
the same machine load. Measured per trial:

- wall s from process start: from just before the trial process is spawned (interpreter start,
  imports and env creation count) to the end of training (the final evaluation does not count);
- wall s from the first env step: from the first ``step`` of the env class (patched in the trial
  process, identically for both sides) to the end of training;
- CPU s: user + sys CPU seconds of the trial process at the end of training (steadier than wall
  time on a shared machine);
- env steps/s: env steps / wall s from the first env step;
- gradient steps/s: gradient steps / seconds spent in the algorithm's ``train`` call (batch sampling,
  the updates, target updates), and that time's share of the wall time from the first env step;
- eval return: mean return of the trained policy, deterministic actions, on a separate env whose
  episode i is reset with seed 10_000 + i (20 episodes for CartPole, 10 for Pendulum), same loop for
  both sides;
- steps to target: the env step at which the mean return of the last W training episodes (a full
  window) first reaches the target: W = 100 and 10 for CartPole (>= 475), W = 10 for Pendulum
  (>= -200); "-" when not reached. Episode ends are exact env steps on both sides (SB3: its Monitor;
  polar: the fragment's done flags).

    .venv/bin/pip install -e '.[bench]'
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/off_policy_vs_sb3.py --seeds 3 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import deque
from pathlib import Path

from _sb3_compare import (
    EVALUATE_GYM,
    POLAR_OFF_POLICY_CFG,
    POLAR_TOOLS,
    POLAR_TRAIN,
    SB3_LEARN,
    SIDES,
    TRIAL_HEAD,
    TRIAL_TOOLS,
    cell,
    markdown_lines,
    ratio_cell,
    spawn_trial,
    trial_plan,
    versions,
)

ROOT = Path(__file__).resolve().parents[1]
EVAL_SEED = 10_000

WORKLOADS = {
    "dqn": {
        "title": "DQN on CartPole-v1",
        "env_id": "CartPole-v1",
        "config": "examples/cartpole_dqn.yaml",
        "steps": 50_000,
        "hparams": dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
                        target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                        exploration_final_eps=0.04),
        "net_arch": [256, 256],
        "eval_episodes": 20,
        "targets": [(100, 475.0), (10, 475.0)],
    },
    "sac": {
        "title": "SAC on Pendulum-v1",
        "env_id": "Pendulum-v1",
        "config": "examples/pendulum_sac.yaml",
        "steps": 10_000,
        "hparams": dict(learning_rate=1e-3, batch_size=256, buffer_size=1_000_000, learning_starts=100, gamma=0.99,
                        tau=0.005, ent_coef="auto"),
        "net_arch": [256, 256],
        "eval_episodes": 10,
        "targets": [(10, -200.0)],
    },
}

# Both trial kinds: the first-env-step clock, CPU seconds, the update timer, the evaluation loop.
PRELUDE = TRIAL_HEAD + TRIAL_TOOLS + EVALUATE_GYM

POLAR_TRIAL = PRELUDE + POLAR_TOOLS + POLAR_OFF_POLICY_CFG + r"""
EPISODES = []

SEEN = [0]  # env steps before the fragment

def record_episodes(f):
    before = SEEN[0]
    SEEN[0] += f.env_steps
    if f.episode_returns:
        assert f.num_envs == 1, "the benchmark runs one env"
        ends = np.flatnonzero(np.logical_or(f.terminated[:, 0], f.truncated[:, 0])) + before + 1
        assert len(ends) == len(f.episode_returns), (ends, f.episode_returns)
        now = time.time()
        EPISODES.extend([int(s), float(r), now] for s, r in zip(ends, f.episode_returns))

BENCH = ("train", record_episodes)
""" + POLAR_TRAIN + r"""
@torch.inference_mode()
def act(obs):
    return policy.act(obs_to_tensor(obs[None]), None, True)[0][0].numpy()

report(t_end, cpu, act, env_steps=res["env_steps"], grad_steps=trainer.learner.algorithm.n_updates, update_s=UPDATE["s"],
       episodes=EPISODES)
"""

SB3_TRIAL = PRELUDE + r"""
import torch
torch.set_num_threads(A["threads"])
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.env_util import make_vec_env
env = make_vec_env(A["env_id"], n_envs=1, seed=A["seed"])
cls = DQN if A["algo"] == "dqn" else SAC
model = cls("MlpPolicy", env, **A["hparams"], policy_kwargs=dict(net_arch=A["net_arch"]), device="cpu",
            seed=A["seed"], verbose=0)
""" + SB3_LEARN + r"""
mon = env.envs[0]  # make_vec_env's Monitor: every episode's return, length and end time
ends = np.cumsum(mon.get_episode_lengths())
episodes = [[int(s), float(r), mon.t_start + t]
            for s, r, t in zip(ends, mon.get_episode_rewards(), mon.get_episode_times())]
report(t_end, cpu, lambda obs: model.predict(obs, deterministic=True)[0],
       env_steps=model.num_timesteps, grad_steps=model._n_updates, update_s=UPDATE["s"], episodes=episodes)
"""


def run_trial(which: str, workload: str, seed: int, steps: int, threads: int, timeout_s: float) -> dict:
    w = WORKLOADS[workload]
    args = {"algo": workload, "env_id": w["env_id"], "config": str(ROOT / w["config"]), "seed": seed, "steps": steps,
            "hparams": w["hparams"], "net_arch": w["net_arch"], "threads": threads,
            "eval_episodes": w["eval_episodes"], "eval_seed": EVAL_SEED}
    code = POLAR_TRIAL if which == "polar" else SB3_TRIAL
    out, t0, first, from_first = spawn_trial(code, args, threads, timeout_s, f"{which} {workload} seed {seed}")
    r = {"seed": seed, "wall_s": out["t_end"] - t0, "first_step_s": first - t0, "from_first_step_s": from_first,
         "cpu_s": out["cpu_s"], "env_steps": out["env_steps"], "grad_steps": out["grad_steps"],
         "update_s": out["update_s"], "env_sps": out["env_steps"] / from_first,
         "grad_sps": out["grad_steps"] / out["update_s"] if out["update_s"] > 0 else None,
         "update_share": out["update_s"] / from_first, "episodes_done": len(out["episodes"]),
         "eval_mean": statistics.fmean(out["eval_returns"]), "eval_returns": out["eval_returns"]}
    for window, target in w["targets"]:
        hit = first_reach(out["episodes"], window, target)
        r[f"reach_{window}"] = None if hit is None else {"step": hit[0], "wall_s": hit[1] - t0}
    r["episodes"] = out["episodes"]
    return r


def first_reach(episodes: list, window: int, target: float) -> tuple[int, float] | None:
    """(env step, time) of the first episode end where the last ``window`` returns average >= target."""
    last: deque = deque(maxlen=window)
    total = 0.0
    for step, ret, t in episodes:
        if len(last) == window:
            total -= last[0]
        last.append(ret)
        total += ret
        if len(last) == window and total / window >= target:
            return step, t
    return None


def mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def print_table(workload: str, res: dict, steps: int, threads: int) -> None:
    w = WORKLOADS[workload]
    cols = [("wall s (start)", "wall_s", "{:.1f}"), ("wall s (1st step)", "from_first_step_s", "{:.1f}"),
            ("CPU s", "cpu_s", "{:.1f}"), ("env steps/s", "env_sps", "{:,.0f}"),
            ("grad steps/s", "grad_sps", "{:,.0f}"), ("update share", "update_share", "{:.0%}"),
            (f"eval return ({w['eval_episodes']} eps)", "eval_mean", "{:.1f}")]
    reach_cols = [(f"steps to {window}-ep mean >= {target:g}", f"reach_{window}") for window, target in w["targets"]]
    header = ["", "seed"] + [c[0] for c in cols] + [c[0] for c in reach_cols]

    def reach_cell(r, key):
        return "-" if r[key] is None else f"{r[key]['step']:,}"

    rows = []
    for which, name in SIDES:
        for r in res[which]:
            rows.append([name, str(r["seed"])] + [cell(fmt, r[key]) for _, key, fmt in cols]
                        + [reach_cell(r, k) for _, k in reach_cols])
    means = {}
    for which, name in SIDES:
        rs = res[which]
        m = {key: mean([r[key] for r in rs]) for _, key, _ in cols}
        for _, k in reach_cols:
            hits = [r[k]["step"] for r in rs if r[k] is not None]
            m[k] = (statistics.fmean(hits) if hits else None, len(hits), len(rs))
        means[which] = m
        rows.append([f"**{name} mean**", ""] + [cell(fmt, m[key]) for _, key, fmt in cols]
                    + [("-" if m[k][0] is None else f"{m[k][0]:,.0f}") + f" ({m[k][1]}/{m[k][2]})"
                       for _, k in reach_cols])
    # returns can be negative (Pendulum): a difference, not a ratio
    ratio = ["**polar / SB3**", ""] + [ratio_cell(key, means["polar"][key], means["sb3"][key], "{:+.1f} (diff)")
                                       for _, key, _ in cols]
    for _, k in reach_cols:
        (a, na, n), (b, nb, _) = means["polar"][k], means["sb3"][k]
        ratio.append(f"{a / b:.2f}" if na == nb == n and n > 0 else "n/a")
    rows.append(ratio)

    print(f"{w['title']}: {steps:,} env steps per trial, {len(res['polar'])} seeds, {threads} torch thread(s)")
    for line in markdown_lines(header, rows):
        print(line)
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--dqn-steps", type=int, default=WORKLOADS["dqn"]["steps"], help="env steps per DQN trial")
    ap.add_argument("--sac-steps", type=int, default=WORKLOADS["sac"]["steps"], help="env steps per SAC trial")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, the same on both sides")
    ap.add_argument("--timeout-s", type=float, default=3600, help="per trial")
    ap.add_argument("--out", type=Path, default=None, help="also write all raw results (with every episode) as JSON")
    args = ap.parse_args()

    steps = {"dqn": args.dqn_steps, "sac": args.sac_steps}
    results: dict = {"versions": versions(), "threads": args.threads}
    print(results["versions"], file=sys.stderr)
    for workload in args.workloads:
        res = {"polar": [], "sb3": [], "steps": steps[workload]}
        for which, seed in trial_plan(range(args.seeds)):
            r = run_trial(which, workload, seed, steps[workload], args.threads, args.timeout_s)
            res[which].append(r)
            print(f"  {workload} {which:5s} seed {seed}: {r['wall_s']:.1f}s wall "
                  f"({r['from_first_step_s']:.1f}s from first step, {r['cpu_s']:.1f} CPU s), "
                  f"{r['env_steps']} env steps, {r['grad_steps']} grad steps, "
                  f"eval {r['eval_mean']:.1f} (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
        results[workload] = res
    print()
    for workload in args.workloads:
        print_table(workload, results[workload], steps[workload], args.threads)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
