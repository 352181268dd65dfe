"""polar PPO vs Stable-Baselines3 PPO on Atari Breakout, steps/s side by side in one run.

The same envs: both sides build each of the 8 envs with polar's ``harness.preset: atari``
(``polar.harness.make_env`` on ``examples/atari/breakout_ppo.yaml``'s harness: ``ALE/Breakout-v5`` with
its sticky actions (p 0.25) and ``frameskip=1`` underneath, then noop reset up to 30, frame skip 4 with the
last two frames max-pooled, 84x84 grey, episodic life, fire reset, reward clipping, a 4-frame stack,
channels last (84, 84, 4) uint8). polar steps them in its SyncVectorEnv (SAME_STEP autoreset), SB3 in its
DummyVecEnv, each env wrapped in SB3's Monitor (it only records), then VecTransposeImage (SB3 adds it
itself for channels-last images). The same network: the Nature CNN (32 8x8/4, 64 4x4/2, 64 3x3/1, 512
ReLU) shared by the policy and value heads (SB3's CnnPolicy; polar ``agent.cnn_arch: nature``,
``share_encoder: true``), pixels / 255 on both. RL Zoo's Atari PPO hyperparameters on both sides: 8 envs,
n_steps 128, batch 256, 4 epochs, lr 2.5e-4 and clip 0.1 both decayed linearly to 0 over the budget,
vf_coef 0.5, ent_coef 0.01, gamma 0.99, gae_lambda 0.95, max_grad_norm 0.5, advantages normalised.

``--steps`` is agent steps in total over the 8 envs (each is 4 emulator frames): default 12,288
(12 rollouts of 1,024, ~49k frames). A budget this short measures speed, not learning: the return column
is there to show both sides train the same thing, not who learns faster.

One torch thread (``--threads``) on both sides, CPU, no TensorBoard, no progress bar, no checkpoints. Trials
alternate polar / SB3 per seed, each in a fresh process (``--jobs 2`` runs a seed's two at once, so both
see the same load on a shared box). Measured per trial:

- steps/s: agent steps / wall s from the first env step (the ALE env class's ``step`` is patched
  identically on both sides) to the end of training; frames/s is 4x that;
- wall s: from just before the trial process is spawned (imports and env creation count) to the end of
  training; CPU s: user + sys CPU seconds of the trial process then;
- update share: the share of the time from the first step spent in the PPO update (polar's
  ``PPOLearner.update``, SB3's ``PPO.train``: advantages are outside it on SB3, inside on polar); the rest is
  acting and env stepping;
- final return: mean return of the trained policy over ``--eval-episodes`` (default 10) episodes on one more
  env built the same way (so an episode is one life, rewards clipped), sampled actions (a deterministic
  policy this early can stall without pressing FIRE), reset once with seed 10_000.

    .venv/bin/pip install -e '.[bench,sim]'
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/atari_ppo_vs_sb3.py
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
CONFIG = "examples/atari/breakout_ppo.yaml"
ENV_ID = "ALE/Breakout-v5"
EVAL_SEED = 10_000
N_ENVS = 8
# RL Zoo (hyperparams/ppo.yml, atari); examples/atari/breakout_ppo.yaml holds the same values for polar
HPARAMS = dict(n_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4, clip_range=0.1, vf_coef=0.5,
               ent_coef=0.01, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5)
LINE = ("  {which:5s} seed {seed}: {env_sps:.1f} steps/s, {wall_s:.1f}s wall, {cpu_s:.1f} CPU s, {updates} updates, "
        "update share {update_share:.0%}, return {eval_mean:.2f} (load {load_1m:.1f})")

PRELUDE = r"""
import importlib, json, resource, sys, time
A = json.loads(sys.argv[1])
import numpy as np, gymnasium as gym, ale_py
gym.register_envs(ale_py)
from polar.config import load_config
cfg = load_config(A["config"], [f"seed={A['seed']}", f"total_env_steps={A['steps']}", "logging.tensorboard=false",
                                "logging.checkpoint_freq=0", "logging.progress_bar=false", "eval.at_end=false",
                                "distribution.rollout_workers=0", f"distribution.envs_per_worker={A['n_envs']}"]
                  + [f"policy.kwargs.{k}={json.dumps(v)}" for k, v in A["hparams"].items()])
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
    from polar.harness import make_env
    env = make_env(cfg.harness)
    returns, ret, steps = [], 0.0, 0
    obs, _ = env.reset(seed=A["eval_seed"])
    while len(returns) < A["eval_episodes"] and steps < 50_000:
        obs, r, term, trunc, _ = env.step(act(obs))
        ret += float(r)
        steps += 1
        if term or trunc:
            returns.append(ret)
            ret = 0.0
            obs, _ = env.reset()
    env.close()
    return returns or [ret]
def cpu_s():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
def report(t_end, cpu, env_steps, updates, update_s, act):
    print(json.dumps({"t_end": t_end, "t_first_step": FIRST_STEP[0] if FIRST_STEP else None, "cpu_s": cpu,
                      "env_steps": env_steps, "updates": updates, "update_s": update_s,
                      "eval_returns": evaluate(act)}))
"""

POLAR_TRIAL = PRELUDE + r"""
import tempfile
import torch
from polar.rollout.runner import obs_to_tensor
from polar.trainers.on_policy import OnPolicyTrainer
from polar.trainers.run_dir import RunDir
UPDATE = {"s": 0.0, "n": 0}

class BenchTrainer(OnPolicyTrainer):
    def _setup(self):
        super()._setup()
        torch.set_num_threads(A["threads"])  # the trainer sets 1; --threads applies to both sides alike

    def _make_learner(self):
        learner = super()._make_learner()
        update = learner.update
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return update(*args, **kwargs)
            finally:
                UPDATE["s"] += time.perf_counter() - t
                UPDATE["n"] += 1
        learner.update = timed
        return learner

trainer = BenchTrainer(cfg, RunDir.create("bench", tempfile.mkdtemp()))
res = trainer.train()
t_end, cpu = time.time(), cpu_s()
policy = trainer.policy

@torch.inference_mode()
def act(obs):
    return int(policy.act(obs_to_tensor(obs[None]), None, False)[0][0])

report(t_end, cpu, res["env_steps"], UPDATE["n"], UPDATE["s"], act)
"""

SB3_TRIAL = PRELUDE + r"""
import torch
torch.set_num_threads(A["threads"])
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv
from polar.harness import make_env
env = DummyVecEnv([lambda: Monitor(make_env(cfg.harness)) for _ in range(A["n_envs"])])
env.seed(A["seed"])  # env i resets with seed + i, as polar's vector env
h = dict(A["hparams"])
lr, clip = h.pop("learning_rate"), h.pop("clip_range")
model = PPO("CnnPolicy", env, **h, learning_rate=lambda p: p * lr, clip_range=lambda p: p * clip, device="cpu",
            seed=A["seed"], verbose=0)
UPDATE = {"s": 0.0, "n": 0}
train = model.train
def timed(*args, **kwargs):
    t = time.perf_counter()
    try:
        return train(*args, **kwargs)
    finally:
        UPDATE["s"] += time.perf_counter() - t
        UPDATE["n"] += 1
model.train = timed
model.learn(total_timesteps=A["steps"])
t_end, cpu = time.time(), cpu_s()
report(t_end, cpu, model.num_timesteps, UPDATE["n"], UPDATE["s"],
       lambda obs: int(model.predict(obs, deterministic=False)[0]))
"""


def run_trial(which: str, seed: int, steps: int, threads: int, eval_episodes: int, timeout_s: float) -> dict:
    args = {"env_id": ENV_ID, "config": str(ROOT / CONFIG), "seed": seed, "steps": steps, "hparams": HPARAMS,
            "n_envs": N_ENVS, "threads": threads, "eval_episodes": eval_episodes, "eval_seed": EVAL_SEED}
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
            "env_steps": out["env_steps"], "updates": out["updates"], "update_s": out["update_s"],
            "env_sps": out["env_steps"] / from_first, "fps": 4 * out["env_steps"] / from_first,
            "update_share": out["update_s"] / from_first,
            "eval_mean": statistics.fmean(out["eval_returns"]), "eval_returns": out["eval_returns"],
            "load_1m": os.getloadavg()[0]}


COLS = [("final return", "eval_mean", "{:.2f}"), ("wall s", "wall_s", "{:.1f}"), ("CPU s", "cpu_s", "{:.1f}"),
        ("steps/s", "env_sps", "{:,.1f}"), ("frames/s", "fps", "{:,.0f}"), ("update share", "update_share", "{:.0%}")]


def table(res: dict, title: str) -> str:
    """Markdown table: one row per trial, the per-side means, and polar / SB3 of the means."""
    header = ["framework", "seed"] + [c[0] for c in COLS]
    rows, means = [], {}
    for which, name in (("polar", "polar"), ("sb3", "SB3")):
        for r in res[which]:
            rows.append([name, str(r["seed"])] + [fmt.format(r[k]) for _, k, fmt in COLS])
    for which, name in (("polar", "polar"), ("sb3", "SB3")):
        m = {k: statistics.fmean([r[k] for r in res[which]]) if res[which] else None for _, k, _ in COLS}
        means[which] = m
        rows.append([f"**{name} mean**", ""] + [fmt.format(m[k]) if m[k] is not None else "n/a" for _, k, fmt in COLS])
    ratio = ["**polar / SB3**", ""]
    for _, k, _ in COLS:
        a, b = means["polar"][k], means["sb3"][k]
        if k == "eval_mean":
            ratio.append("n/a" if a is None or b is None else f"{a - b:+.2f} (diff)")
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
    import ale_py
    import gymnasium
    import numpy
    import stable_baselines3
    import torch

    return (f"Python {platform.python_version()}, torch {torch.__version__}, gymnasium {gymnasium.__version__}, "
            f"ale-py {ale_py.__version__}, numpy {numpy.__version__}, stable-baselines3 {stable_baselines3.__version__}, "
            f"{os.cpu_count()} CPUs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds to run (default 0)")
    ap.add_argument("--steps", type=int, default=12 * N_ENVS * HPARAMS["n_steps"],
                    help="agent steps per trial, all 8 envs together (x4 frames); default 12 rollouts")
    ap.add_argument("--eval-episodes", type=int, default=10, help="episodes (lives) of the final evaluation")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, the same on both sides")
    ap.add_argument("--jobs", type=int, default=1,
                    help="trials run at once (default 1: one at a time). 2 runs a seed's polar and SB3 trials together, "
                         "2 x seeds runs all: on a shared, loaded box the two sides then see the same load")
    ap.add_argument("--timeout-s", type=float, default=3 * 3600, help="per trial")
    ap.add_argument("--out", type=Path, default=None, help="also write the raw results as JSON")
    args = ap.parse_args()

    res: dict = {"versions": versions(), "steps": args.steps, "hparams": HPARAMS, "threads": args.threads,
                 "polar": [], "sb3": []}
    print(res["versions"], file=sys.stderr)

    def trial(which: str, seed: int) -> tuple[str, dict]:
        return which, run_trial(which, seed, args.steps, args.threads, args.eval_episodes, args.timeout_s)

    plan = [(which, seed) for seed in args.seeds for which in (("polar", "sb3") if seed % 2 == 0 else ("sb3", "polar"))]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for which, r in pool.map(lambda t: trial(*t), plan):  # in plan order; the trials overlap up to --jobs
            res[which].append(r)
            print(LINE.format(which=which, **r), file=sys.stderr, flush=True)
            if args.out:
                args.out.write_text(json.dumps(res, indent=1))
    print()
    print(table(res, f"PPO on {ENV_ID} (polar's Atari preset on both sides, {N_ENVS} envs): {args.steps:,} agent steps "
                     f"({4 * args.steps:,} frames) per trial, {len(args.seeds)} seed(s), {args.threads} torch thread(s), "
                     f"{'trials one at a time' if args.jobs <= 1 else f'{args.jobs} trials at once'}, "
                     f"final return = mean of {args.eval_episodes} sampled-action eval episodes (lives, clipped)"))


if __name__ == "__main__":
    main()
