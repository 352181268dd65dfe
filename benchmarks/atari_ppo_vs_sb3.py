"""polar PPO vs Stable-Baselines3 PPO on Atari Breakout, steps/s side by side in one run.

The same envs: both sides build each of the 8 envs with polar's ``harness.preset: atari``
(``polar.harness.make_env`` on ``examples/atari/breakout_ppo.yaml``'s harness: ``ALE/Breakout-v5`` with
its sticky actions (p 0.25) and ``frameskip=1`` underneath, then noop reset up to 30, frame skip 4 with the
last two frames max-pooled, 84x84 grey, episodic life, fire reset, reward clipping, a 4-frame stack,
channels last (84, 84, 4) uint8). polar steps them in its SameStepVectorEnv (SAME_STEP autoreset), SB3 in its
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
import os
import statistics
import sys
from pathlib import Path

from _sb3_compare import (
    JOBS_HELP,
    POLAR_TOOLS,
    POLAR_TRAIN,
    SB3_LEARN,
    TRIAL_HEAD,
    TRIAL_TOOLS,
    run_trials,
    spawn_trial,
    trial_table,
    versions,
)

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

# Both sides: ALE registered and polar's config (its harness builds the envs) before the first-step clock,
# and an evaluation on one more env from that harness: an episode is one life, rewards clipped.
PRELUDE = TRIAL_HEAD + r"""
import ale_py
gym.register_envs(ale_py)
from polar.config import load_config
cfg = load_config(A["config"], [f"seed={A['seed']}", f"total_env_steps={A['steps']}", "logging.tensorboard=false",
                                "logging.checkpoint_freq=0", "logging.progress_bar=false", "eval.at_end=false",
                                "distribution.rollout_workers=0", f"distribution.envs_per_worker={A['n_envs']}"]
                  + [f"policy.kwargs.{k}={json.dumps(v)}" for k, v in A["hparams"].items()])
""" + TRIAL_TOOLS + r"""
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
"""

POLAR_TRIAL = PRELUDE + POLAR_TOOLS + r"""
BENCH = ("update",)
""" + POLAR_TRAIN + r"""
@torch.inference_mode()
def act(obs):
    return int(policy.act(obs_to_tensor(obs[None]), None, False)[0][0])

report(t_end, cpu, act, env_steps=res["env_steps"], updates=UPDATE["n"], update_s=UPDATE["s"])
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
""" + SB3_LEARN + r"""
report(t_end, cpu, lambda obs: int(model.predict(obs, deterministic=False)[0]),
       env_steps=model.num_timesteps, updates=UPDATE["n"], update_s=UPDATE["s"])
"""


def run_trial(which: str, seed: int, steps: int, threads: int, eval_episodes: int, timeout_s: float) -> dict:
    args = {"env_id": ENV_ID, "config": str(ROOT / CONFIG), "seed": seed, "steps": steps, "hparams": HPARAMS,
            "n_envs": N_ENVS, "threads": threads, "eval_episodes": eval_episodes, "eval_seed": EVAL_SEED}
    code = POLAR_TRIAL if which == "polar" else SB3_TRIAL
    out, t0, _, from_first = spawn_trial(code, args, threads, timeout_s, f"{which} seed {seed}")
    return {"seed": seed, "wall_s": out["t_end"] - t0, "from_first_step_s": from_first, "cpu_s": out["cpu_s"],
            "env_steps": out["env_steps"], "updates": out["updates"], "update_s": out["update_s"],
            "env_sps": out["env_steps"] / from_first, "fps": 4 * out["env_steps"] / from_first,
            "update_share": out["update_s"] / from_first,
            "eval_mean": statistics.fmean(out["eval_returns"]), "eval_returns": out["eval_returns"],
            "load_1m": os.getloadavg()[0]}


COLS = [("final return", "eval_mean", "{:.2f}"), ("wall s", "wall_s", "{:.1f}"), ("CPU s", "cpu_s", "{:.1f}"),
        ("steps/s", "env_sps", "{:,.1f}"), ("frames/s", "fps", "{:,.0f}"), ("update share", "update_share", "{:.0%}")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds to run (default 0)")
    ap.add_argument("--steps", type=int, default=12 * N_ENVS * HPARAMS["n_steps"],
                    help="agent steps per trial, all 8 envs together (x4 frames); default 12 rollouts")
    ap.add_argument("--eval-episodes", type=int, default=10, help="episodes (lives) of the final evaluation")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, the same on both sides")
    ap.add_argument("--jobs", type=int, default=1, help=JOBS_HELP)
    ap.add_argument("--timeout-s", type=float, default=3 * 3600, help="per trial")
    ap.add_argument("--out", type=Path, default=None, help="also write the raw results as JSON")
    args = ap.parse_args()

    res: dict = {"versions": versions(("ale-py", "ale_py")), "steps": args.steps, "hparams": HPARAMS,
                 "threads": args.threads, "polar": [], "sb3": []}
    print(res["versions"], file=sys.stderr)

    def trial(which: str, seed: int) -> dict:
        return run_trial(which, seed, args.steps, args.threads, args.eval_episodes, args.timeout_s)

    run_trials(res, args.seeds, args.jobs, trial, LINE, args.out)
    print()
    title = (f"PPO on {ENV_ID} (polar's Atari preset on both sides, {N_ENVS} envs): {args.steps:,} agent steps "
             f"({4 * args.steps:,} frames) per trial, {len(args.seeds)} seed(s), {args.threads} torch thread(s), "
             f"{'trials one at a time' if args.jobs <= 1 else f'{args.jobs} trials at once'}, "
             f"final return = mean of {args.eval_episodes} sampled-action eval episodes (lives, clipped)")
    print(trial_table(res, title, COLS, "{:+.2f} (diff)"))


if __name__ == "__main__":
    main()
