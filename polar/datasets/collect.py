"""Episodes of a policy on an env harness, for ``polar collect`` (one env, so every episode is whole)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from polar.agents import check_act_output
from polar.datasets.minari import Episode


def collect_episodes(policy: Any, harness_cfg: Any, episodes: int, seed: int = 0, deterministic: bool = True,
                     epsilon: float = 0.0, config_dir: Path | None = None,
                     max_episode_steps: int = 100_000) -> Iterator[Episode]:
    """``episodes`` episodes of ``policy``; with ``epsilon`` > 0 each action is uniformly random with that
    probability (a "medium"/"mixed" dataset from a good policy). Episode ``i`` resets with seed ``seed + i``."""
    from polar.harness import make_vector_env

    env = make_vector_env(harness_cfg, 1, seed=seed, config_dir=config_dir)
    rng = np.random.default_rng(seed)
    space = env.single_action_space
    space.seed(seed)
    agent = policy.agent
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            state = agent.get_initial_state(1)
            observations: list[np.ndarray] = [obs[0]]
            actions: list[np.ndarray] = []
            rewards: list[float] = []
            terms: list[bool] = []
            truncs: list[bool] = []
            while True:
                with torch.no_grad():
                    action, state, _ = policy.act(torch.as_tensor(np.asarray(obs)), state, deterministic)
                act = check_act_output(agent, action, 1, space)
                if isinstance(space, gym.spaces.Box):
                    act = np.clip(act, space.low, space.high)
                if epsilon > 0 and rng.random() < epsilon:
                    act = np.asarray([space.sample()])
                obs, rew, term, trunc, infos = env.step(act)
                cut = len(rewards) + 1 >= max_episode_steps
                done = bool(term[0] or trunc[0] or cut)
                actions.append(np.asarray(act[0], dtype=space.dtype))
                rewards.append(float(rew[0]))
                terms.append(bool(term[0]))
                truncs.append(bool(trunc[0]) or (cut and not bool(term[0])))
                # SAME_STEP autoreset: the returned observation is the next episode's; the final one is in infos
                observations.append(infos["final_obs"][0] if done and "final_obs" in infos else obs[0])
                if done:
                    break
            yield Episode(np.stack(observations), np.stack(actions), np.asarray(rewards), np.asarray(terms),
                          np.asarray(truncs), seed=seed + i)
    finally:
        env.close()
