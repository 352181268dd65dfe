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
import os
import statistics
import sys
from pathlib import Path

from _sb3_compare import (
    EVALUATE_GYM,
    JOBS_HELP,
    POLAR_OFF_POLICY_CFG,
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
ENV_ID = "HalfCheetah-v5"
CONFIG = "examples/mujoco/halfcheetah_sac.yaml"
EVAL_SEED = 10_000
# RL Zoo (hyperparams/sac.yml, HalfCheetah): SB3's defaults but learning_starts 10k; both sides get all of them
HPARAMS = dict(learning_rate=3e-4, batch_size=256, buffer_size=1_000_000, learning_starts=10_000, gamma=0.99,
               tau=0.005, train_freq=1, gradient_steps=1, ent_coef="auto")
NET_ARCH = [256, 256]
LINE = ("  {which:5s} seed {seed}: return {eval_mean:.1f}, {wall_s:.1f}s wall, {cpu_s:.1f} CPU s, {env_sps:.1f} env steps/s, "
        "{grad_steps} grad steps, update share {update_share:.0%} (load {load_1m:.1f})")

PRELUDE = TRIAL_HEAD + TRIAL_TOOLS + EVALUATE_GYM

POLAR_TRIAL = PRELUDE + POLAR_TOOLS + POLAR_OFF_POLICY_CFG + r"""
BENCH = ("train",)
""" + POLAR_TRAIN + r"""
@torch.inference_mode()
def act(obs):
    return policy.act(obs_to_tensor(obs[None]), None, True)[0][0].numpy()

report(t_end, cpu, act, env_steps=res["env_steps"], grad_steps=trainer.learner.algorithm.n_updates, update_s=UPDATE["s"])
"""

SB3_TRIAL = PRELUDE + r"""
import torch
torch.set_num_threads(A["threads"])
from stable_baselines3 import SAC
from stable_baselines3.common.env_util import make_vec_env
env = make_vec_env(A["env_id"], n_envs=1, seed=A["seed"])
model = SAC("MlpPolicy", env, **A["hparams"], policy_kwargs=dict(net_arch=A["net_arch"]), device="cpu",
            seed=A["seed"], verbose=0)
""" + SB3_LEARN + r"""
report(t_end, cpu, lambda obs: model.predict(obs, deterministic=True)[0],
       env_steps=model.num_timesteps, grad_steps=model._n_updates, update_s=UPDATE["s"])
"""


def run_trial(which: str, seed: int, steps: int, hparams: dict, threads: int, eval_episodes: int,
              timeout_s: float) -> dict:
    args = {"env_id": ENV_ID, "config": str(ROOT / CONFIG), "seed": seed, "steps": steps, "hparams": hparams,
            "net_arch": NET_ARCH, "threads": threads, "eval_episodes": eval_episodes, "eval_seed": EVAL_SEED}
    code = POLAR_TRIAL if which == "polar" else SB3_TRIAL
    out, t0, _, from_first = spawn_trial(code, args, threads, timeout_s, f"{which} seed {seed}")
    return {"seed": seed, "wall_s": out["t_end"] - t0, "from_first_step_s": from_first, "cpu_s": out["cpu_s"],
            "env_steps": out["env_steps"], "grad_steps": out["grad_steps"], "update_s": out["update_s"],
            "env_sps": out["env_steps"] / from_first, "update_share": out["update_s"] / from_first,
            "grad_sps": out["grad_steps"] / out["update_s"] if out["update_s"] > 0 else None,
            "eval_mean": statistics.fmean(out["eval_returns"]), "eval_returns": out["eval_returns"],
            "load_1m": os.getloadavg()[0]}


COLS = [("final return", "eval_mean", "{:.1f}"), ("wall s", "wall_s", "{:.1f}"), ("CPU s", "cpu_s", "{:.1f}"),
        ("env steps/s", "env_sps", "{:,.1f}"), ("grad steps/s in train", "grad_sps", "{:,.1f}"),
        ("update share", "update_share", "{:.0%}")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run (default 0 1 2)")
    ap.add_argument("--steps", type=int, default=100_000, help="env steps per trial (the issue's budget: 100k)")
    ap.add_argument("--learning-starts", type=int, default=HPARAMS["learning_starts"],
                    help="random-action steps before training, both sides (RL Zoo: 10000)")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, the same on both sides")
    ap.add_argument("--timeout-s", type=float, default=6 * 3600, help="per trial")
    ap.add_argument("--jobs", type=int, default=1, help=JOBS_HELP)
    ap.add_argument("--out", type=Path, default=None, help="also write the raw results as JSON (rewritten per trial)")
    args = ap.parse_args()

    hparams = {**HPARAMS, "learning_starts": args.learning_starts}
    res: dict = {"versions": versions(("mujoco", "mujoco")), "steps": args.steps, "hparams": hparams,
                 "threads": args.threads, "polar": [], "sb3": []}
    print(res["versions"], file=sys.stderr)
    def trial(which: str, seed: int) -> dict:
        return run_trial(which, seed, args.steps, hparams, args.threads, args.eval_episodes, args.timeout_s)

    run_trials(res, args.seeds, args.jobs, trial, LINE, args.out)
    print()
    title = (f"SAC on {ENV_ID}: {args.steps:,} env steps per trial (learning_starts {args.learning_starts:,}), "
             f"{len(args.seeds)} seed(s), {args.threads} torch thread(s), "
             f"{'trials one at a time' if args.jobs <= 1 else f'{args.jobs} trials at once'}, final return = mean of "
             f"{args.eval_episodes} deterministic eval episodes")
    print(trial_table(res, title, COLS, "{:+.1f} (diff)"))


if __name__ == "__main__":
    main()
