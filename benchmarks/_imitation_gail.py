"""imitation's GAIL on a polar dataset (runs in .imitation-venv: ``make imitation``; benchmarks/gail_vs_imitation.py
calls it). Reads the Minari HDF5 file ``polar collect`` wrote, turns each episode into an ``imitation``
``Trajectory``, trains ``imitation.algorithms.adversarial.gail.GAIL`` with a Stable-Baselines3 PPO generator
configured as polar's run is, evaluates deterministic episodes and writes a JSON result."""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import h5py
import numpy as np
import torch
from imitation.algorithms.adversarial.gail import GAIL
from imitation.data.types import Trajectory
from imitation.data.wrappers import RolloutInfoWrapper
from imitation.rewards.reward_nets import BasicRewardNet
from imitation.util.networks import RunningNorm
from imitation.util.util import make_vec_env
from stable_baselines3 import PPO
from stable_baselines3.ppo import MlpPolicy


def trajectories(path: str) -> list[Trajectory]:
    """Each ``episode_<i>`` group of the Minari file as one Trajectory (observations include the final one)."""
    out = []
    with h5py.File(path, "r") as f:
        for name in sorted((k for k in f if k.startswith("episode_")), key=lambda k: int(k.split("_", 1)[1])):
            g = f[name]
            obs = np.asarray(g["observations"][()], np.float32)
            acts = np.asarray(g["actions"][()])
            out.append(Trajectory(obs=obs, acts=acts, infos=None, terminal=bool(g["terminations"][()][-1])))
    return out


def evaluate(policy: PPO, env_id: str, episodes: int, seed: int) -> list[float]:
    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            action, _ = policy.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = env.step(action)
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return returns


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True, help="main_data.hdf5 of a polar collect dataset")
    p.add_argument("--env-id", required=True)
    p.add_argument("--total-env-steps", type=int, required=True)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--ppo", default="{}", help="SB3 PPO kwargs as JSON (polar's generator settings)")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--disc-hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument("--disc-learning-rate", type=float, default=3e-4)
    p.add_argument("--disc-updates", type=int, default=4)
    p.add_argument("--disc-batch-size", type=int, default=256)
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--eval-seed", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(a.seed)
    trajs = trajectories(a.dataset)
    venv = make_vec_env(a.env_id, rng=rng, n_envs=a.num_envs,
                        post_wrappers=[lambda env, _: RolloutInfoWrapper(env)])
    ppo_kw = json.loads(a.ppo)
    gen = PPO(env=venv, policy=MlpPolicy, seed=a.seed, device="cpu", verbose=0,
              policy_kwargs={"net_arch": {"pi": a.hidden, "vf": a.hidden}}, **ppo_kw)
    reward_net = BasicRewardNet(venv.observation_space, venv.action_space, normalize_input_layer=RunningNorm,
                                hid_sizes=a.disc_hidden)
    trainer = GAIL(demonstrations=trajs, demo_batch_size=a.disc_batch_size, n_disc_updates_per_round=a.disc_updates,
                   venv=venv, gen_algo=gen, reward_net=reward_net, disc_opt_kwargs={"lr": a.disc_learning_rate},
                   allow_variable_horizon=True, log_dir="/tmp/imitation-gail-logs")
    t0 = time.perf_counter()
    trainer.train(a.total_env_steps)
    train_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    returns = evaluate(gen, a.env_id, a.eval_episodes, a.eval_seed)
    eval_s = time.perf_counter() - t1
    with open(a.out, "w") as f:
        json.dump({"returns": returns, "return_mean": float(np.mean(returns)), "return_std": float(np.std(returns)),
                   "env_steps": int(gen.num_timesteps), "train_s": train_s, "eval_s": eval_s,
                   "demo_episodes": len(trajs), "demo_steps": int(sum(len(t) for t in trajs))}, f)


if __name__ == "__main__":
    main()
