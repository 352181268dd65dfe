"""Datasets for the offline tests, generated here (nothing is downloaded): a scripted CartPole controller that
balances (the "expert"), the same with random actions mixed in, random Pendulum play and a Pendulum swing-up
controller."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from polar.config import RunConfig, validate
from polar.datasets.minari import Episode, write_dataset


def cartpole_expert(obs: np.ndarray) -> int:
    """Push towards where the pole falls (angle + angular velocity): ~500 steps per episode on CartPole-v1."""
    return int(obs[2] + 0.5 * obs[3] > 0)


def pendulum_controller(obs: np.ndarray) -> np.ndarray:
    """Pendulum-v1 swing-up: pump energy (E = w^2/2 + 15 cos th, 15 upright at rest) along the velocity, then a PD
    hold near the top; about -140 per 200-step episode (uniform random: ~-1200)."""
    c, s, w = (float(x) for x in obs)
    if c > 0.9:
        u = -(10.0 * np.arctan2(s, c) + 2.0 * w)
    else:
        u = 0.5 * w * (15.0 - (0.5 * w * w + 15.0 * c))
    return np.array([np.clip(u, -2.0, 2.0)], np.float32)


def play(env_id: str, episodes: int, act, seed: int = 0, epsilon: float = 0.0, max_steps: int = 500) -> list[Episode]:
    env = gym.make(env_id, max_episode_steps=max_steps)
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    out = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        observations, actions, rewards, terms, truncs = [obs], [], [], [], []
        while True:
            a = env.action_space.sample() if act is None or rng.random() < epsilon else act(obs)
            obs, r, term, trunc, _ = env.step(a)
            observations.append(obs)
            actions.append(a)
            rewards.append(r)
            terms.append(term)
            truncs.append(trunc)
            if term or trunc:
                break
        out.append(Episode(np.stack(observations).astype(np.float32), np.asarray(actions), np.asarray(rewards),
                           np.asarray(terms), np.asarray(truncs), seed=seed + i))
    env.close()
    return out


def write(path, env_id: str, episodes: list[Episode]):
    env = gym.make(env_id)
    try:
        return write_dataset(path, episodes, env.observation_space, env.action_space, env_id=env_id)
    finally:
        env.close()


def offline_config(env_id: str, algo: str, dataset, gradient_steps: int = 1000, **kwargs) -> RunConfig:
    return validate(RunConfig, {
        "name": f"offline-{algo}", "harness": {"type": "gymnasium", "id": env_id},
        "agent": {"type": "mlp", "hidden_sizes": [64, 64]},
        "policy": {"type": algo, "kwargs": {"dataset": str(dataset), "gradient_steps": gradient_steps,
                                            "steps_per_iteration": 500, **kwargs}},
        "distribution": {"backend": "local"},
        "logging": {"tensorboard": False, "progress_bar": False},
        "eval": {"episodes": 10, "num_envs": 2}})
