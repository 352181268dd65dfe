"""polar SAC vs Stable-Baselines3 SAC on MuJoCo HalfCheetah-v5, side by side in one run.

The same env (``gymnasium.make("HalfCheetah-v5")``, no wrappers beyond Gymnasium's TimeLimit of 1,000
steps; SB3 adds its Monitor, which only records), the same network (256-256 ReLU actor and twin
critics, SB3's SAC MlpPolicy) and RL Zoo's HalfCheetah hyperparameters on both sides, set from one dict
below (polar gets them as ``-o policy.kwargs.*`` overrides of ``examples/mujoco/halfcheetah_sac.yaml``,
SB3 as constructor arguments): lr 3e-4, batch 256, buffer 1M, learning_starts 10,000 (``--learning-starts``),
gamma 0.99, tau 0.005, train_freq 1, one gradient step per env step, ent_coef auto (target entropy
-dim(A)). The issue's budget is the default: 100k env steps per trial, 3 seeds.

One env, ``--threads`` torch threads (default 1) on both sides, no TensorBoard, no progress bar, no
replay-buffer checkpoint, CPU. Trials alternate polar / SB3 per seed (polar first on even seeds, SB3
first on odd ones), each in a fresh process, so both see the same machine load; ``--jobs N`` overlaps N
trials (``--jobs 6`` runs 3 seeds x 2 sides at once: on a shared box every trial then sees the same load,
on an idle one it needs 6 free cores). Measured per trial:

- final return: mean return of the trained policy over ``--eval-episodes`` (default 10) full episodes,
  deterministic actions, on a separate env whose episode i is reset with seed 10_000 + i; the same loop
  for both sides;
- wall s: from just before the trial process is spawned (interpreter start, imports and env creation
  count) to the end of training (the final evaluation does not count);
- CPU s: user + sys CPU seconds of the trial process at the end of training (steadier than wall time on
  a shared machine: waiting for a core does not count);
- env steps/s: env steps / wall s from the first env step (the env class's ``step`` is patched
  identically on both sides) to the end of training;
- update share: the share of that time spent in the algorithm's ``train`` call (batch sampling, the
  gradient steps, the target updates); the rest is acting, env stepping and buffer writes.

    .venv/bin/pip install -e '.[bench,sim]'
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/mujoco_sac_vs_sb3.py            # 100k steps x 3 seeds
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/mujoco_sac_vs_sb3.py --steps 20000 --learning-starts 5000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "HalfCheetah-v5"
CONFIG = "examples/mujoco/halfcheetah_sac.yaml"
EVAL_SEED = 10_000
# RL Zoo (hyperparams/sac.yml, HalfCheetah): SB3's defaults but learning_starts 10k; both sides get all of them
HPARAMS = dict(learning_rate=3e-4, batch_size=256, buffer_size=1_000_000, learning_starts=10_000, gamma=0.99,
               tau=0.005, train_freq=1, gradient_steps=1, ent_coef="auto")
NET_ARCH = [256, 256]
LINE = ("  {which:5s} seed {seed}: return {eval_mean:.1f}, {wall_s:.1f}s wall, {cpu_s:.1f} CPU s, {env_sps:.1f} env steps/s, "
        "{grad_steps} grad steps, update share {update_share:.0%} (load {load_1m:.1f})")

PRELUDE = r"""
import importlib, json, resource, sys, time
A = json.loads(sys.argv[1])
import numpy as np, gymnasium as gym
FIRST_STEP = []
def _patch_first_step(env_id):
    mod, _, name = gym.spec(env_id).entry_point.partition(":")
    cls = getattr(importlib.import_module(mod), name)
    orig = cls.step
    def step(self, action):
        FIRST_STEP.append(time.time())
        cls.step = orig
        return orig(self, action)
    cls.step = step
_patch_first_step(A["env_id"])
def evaluate(act):
    env = gym.make(A["env_id"])
    space = env.action_space
    returns = []
    for i in range(A["eval_episodes"]):
        obs, _ = env.reset(seed=A["eval_seed"] + i)
        ret, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(np.clip(act(obs), space.low, space.high))
            ret += float(r)
            done = term or trunc
        returns.append(ret)
    env.close()
    return returns
def cpu_s():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
def report(t_end, cpu, env_steps, grad_steps, update_s, act):
    print(json.dumps({"t_end": t_end, "t_first_step": FIRST_STEP[0] if FIRST_STEP else None, "cpu_s": cpu,
                      "env_steps": env_steps, "grad_steps": grad_steps, "update_s": update_s,
                      "eval_returns": evaluate(act)}))
"""

POLAR_TRIAL = PRELUDE + r"""
import tempfile
import torch
from polar.config import load_config
from polar.rollout.runner import obs_to_tensor
from polar.trainers.off_policy import OffPolicyTrainer
from polar.trainers.run_dir import RunDir
overrides = [f"seed={A['seed']}", f"total_env_steps={A['steps']}", "logging.tensorboard=false",
             "logging.checkpoint_freq=0", "logging.progress_bar=false", "eval.at_end=false",
             "policy.kwargs.save_replay_buffer=false", f"agent.hidden_sizes={json.dumps(A['net_arch'])}",
             "distribution.rollout_workers=0", "distribution.envs_per_worker=1"]
overrides += [f"policy.kwargs.{k}={json.dumps(v)}" for k, v in A["hparams"].items()]
cfg = load_config(A["config"], overrides)
UPDATE = {"s": 0.0}

class BenchTrainer(OffPolicyTrainer):
    def _setup(self):
        super()._setup()
        torch.set_num_threads(A["threads"])  # the trainer sets 1; --threads applies to both sides alike

    def _make_learner(self):
        learner = super()._make_learner()
        train = learner.train
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return train(*args, **kwargs)
            finally:
                UPDATE["s"] += time.perf_counter() - t
        learner.train = timed
        return learner

trainer = BenchTrainer(cfg, RunDir.create("bench", tempfile.mkdtemp()))
res = trainer.train()
t_end, cpu = time.time(), cpu_s()
policy = trainer.policy

@torch.inference_mode()
def act(obs):
    return policy.act(obs_to_tensor(obs[None]), None, True)[0][0].numpy()

report(t_end, cpu, res["env_steps"], trainer.learner.n_updates, UPDATE["s"], act)
"""

SB3_TRIAL = PRELUDE + r"""
import torch
torch.set_num_threads(A["threads"])
from stable_baselines3 import SAC
from stable_baselines3.common.env_util import make_vec_env
env = make_vec_env(A["env_id"], n_envs=1, seed=A["seed"])
model = SAC("MlpPolicy", env, **A["hparams"], policy_kwargs=dict(net_arch=A["net_arch"]), device="cpu",
            seed=A["seed"], verbose=0)
UPDATE = {"s": 0.0}
train = model.train
def timed(*args, **kwargs):
    t = time.perf_counter()
    try:
        return train(*args, **kwargs)
    finally:
        UPDATE["s"] += time.perf_counter() - t
model.train = timed
model.learn(total_timesteps=A["steps"])
t_end, cpu = time.time(), cpu_s()
report(t_end, cpu, model.num_timesteps, model._n_updates, UPDATE["s"],
       lambda obs: model.predict(obs, deterministic=True)[0])
"""


def run_trial(which: str, seed: int, steps: int, hparams: dict, threads: int, eval_episodes: int,
              timeout_s: float) -> dict:
    args = {"env_id": ENV_ID, "config": str(ROOT / CONFIG), "seed": seed, "steps": steps, "hparams": hparams,
            "net_arch": NET_ARCH, "threads": threads, "eval_episodes": eval_episodes, "eval_seed": EVAL_SEED}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    code = POLAR_TRIAL if which == "polar" else SB3_TRIAL
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                       timeout=timeout_s, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{which} seed {seed} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    first = out["t_first_step"] if out["t_first_step"] is not None else t0
    from_first = out["t_end"] - first
    return {"seed": seed, "wall_s": out["t_end"] - t0, "from_first_step_s": from_first, "cpu_s": out["cpu_s"],
            "env_steps": out["env_steps"], "grad_steps": out["grad_steps"], "update_s": out["update_s"],
            "env_sps": out["env_steps"] / from_first, "update_share": out["update_s"] / from_first,
            "grad_sps": out["grad_steps"] / out["update_s"] if out["update_s"] > 0 else None,
            "eval_mean": statistics.fmean(out["eval_returns"]), "eval_returns": out["eval_returns"],
            "load_1m": os.getloadavg()[0]}


COLS = [("final return", "eval_mean", "{:.1f}"), ("wall s", "wall_s", "{:.1f}"), ("CPU s", "cpu_s", "{:.1f}"),
        ("env steps/s", "env_sps", "{:,.1f}"), ("grad steps/s in train", "grad_sps", "{:,.1f}"),
        ("update share", "update_share", "{:.0%}")]


def table(res: dict, title: str) -> str:
    """Markdown table: one row per trial, the per-side means, and polar / SB3 of the means."""
    header = ["framework", "seed"] + [c[0] for c in COLS]
    rows, means = [], {}
    for which, name in (("polar", "polar"), ("sb3", "SB3")):
        for r in res[which]:
            rows.append([name, str(r["seed"])] + [fmt.format(r[k]) if r[k] is not None else "n/a" for _, k, fmt in COLS])
    for which, name in (("polar", "polar"), ("sb3", "SB3")):
        m = {k: statistics.fmean([r[k] for r in res[which]]) if all(r[k] is not None for r in res[which]) else None
             for _, k, _ in COLS}
        means[which] = m
        rows.append([f"**{name} mean**", ""] + [fmt.format(m[k]) if m[k] is not None else "n/a" for _, k, fmt in COLS])
    ratio = ["**polar / SB3**", ""]
    for _, k, _ in COLS:
        a, b = means["polar"][k], means["sb3"][k]
        if k == "eval_mean":  # returns can be negative this early: a difference, not a ratio
            ratio.append("n/a" if a is None or b is None else f"{a - b:+.1f} (diff)")
        else:
            ratio.append("" if k == "update_share" else "n/a" if not a or not b else f"{a / b:.2f}")
    rows.append(ratio)
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + " |"

    sep = "|" + "|".join("-" * (w + 1) + ":" if i >= 2 else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([title, line(header), sep, *map(line, rows)])


def versions() -> str:
    import gymnasium
    import mujoco
    import numpy
    import stable_baselines3
    import torch

    return (f"Python {platform.python_version()}, torch {torch.__version__}, gymnasium {gymnasium.__version__}, "
            f"mujoco {mujoco.__version__}, numpy {numpy.__version__}, stable-baselines3 {stable_baselines3.__version__}, "
            f"{os.cpu_count()} CPUs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run (default 0 1 2)")
    ap.add_argument("--steps", type=int, default=100_000, help="env steps per trial (the issue's budget: 100k)")
    ap.add_argument("--learning-starts", type=int, default=HPARAMS["learning_starts"],
                    help="random-action steps before training, both sides (RL Zoo: 10000)")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, the same on both sides")
    ap.add_argument("--timeout-s", type=float, default=6 * 3600, help="per trial")
    ap.add_argument("--jobs", type=int, default=1,
                    help="trials run at once (default 1: one at a time). 2 runs a seed's polar and SB3 trials together, "
                         "2 x seeds runs all: on a shared, loaded box the two sides then see the same load")
    ap.add_argument("--out", type=Path, default=None, help="also write the raw results as JSON (rewritten per trial)")
    args = ap.parse_args()

    hparams = {**HPARAMS, "learning_starts": args.learning_starts}
    res: dict = {"versions": versions(), "steps": args.steps, "hparams": hparams, "threads": args.threads,
                 "polar": [], "sb3": []}
    print(res["versions"], file=sys.stderr)
    def trial(which: str, seed: int) -> tuple[str, dict]:
        return which, run_trial(which, seed, args.steps, hparams, args.threads, args.eval_episodes, args.timeout_s)

    plan = [(which, seed) for seed in args.seeds for which in (("polar", "sb3") if seed % 2 == 0 else ("sb3", "polar"))]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for which, r in pool.map(lambda t: trial(*t), plan):  # in plan order; the trials overlap up to --jobs
            res[which].append(r)
            print(LINE.format(which=which, **r), file=sys.stderr, flush=True)
            if args.out:
                args.out.write_text(json.dumps(res, indent=1))
    print()
    print(table(res, f"SAC on {ENV_ID}: {args.steps:,} env steps per trial (learning_starts {args.learning_starts:,}), "
                     f"{len(args.seeds)} seed(s), {args.threads} torch thread(s), "
                     f"{'trials one at a time' if args.jobs <= 1 else f'{args.jobs} trials at once'}, final return = mean of "
                     f"{args.eval_episodes} deterministic eval episodes"))


if __name__ == "__main__":
    main()
