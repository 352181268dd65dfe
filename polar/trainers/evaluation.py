"""Evaluation: deterministic episodes on env instances of their own, with their own seeds."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from polar.agents import check_act_output, reset_state
from polar.rollout.runner import obs_to_tensor


@torch.inference_mode()
def evaluate_policy(policy, harness_cfg, episodes: int = 20, seed: int = 10_000, deterministic: bool = True,
                    num_envs: int = 4, config_dir: Path | None = None, max_episode_steps: int = 100_000) -> dict:
    """Run ``episodes`` episodes and report mean/std return, length and success rate (when the env
    reports ``info["success"]``). Episodes are split evenly over the envs (as SB3's evaluate_policy),
    so short episodes do not crowd out long ones."""
    from polar.harness import make_vector_env

    num_envs = max(1, min(num_envs, episodes))
    env = make_vector_env(harness_cfg, num_envs, seed=seed, config_dir=config_dir)
    try:
        space = env.single_action_space
        targets = np.array([(episodes + i) // num_envs for i in range(num_envs)])
        counts = np.zeros(num_envs, dtype=np.int64)
        returns, lengths, successes = [], [], []
        ep_ret = np.zeros(num_envs)
        ep_len = np.zeros(num_envs, dtype=np.int64)
        obs, _ = env.reset(seed=seed)
        agent = policy.agent
        state = agent.get_initial_state(num_envs)
        initial = agent.get_initial_state(num_envs)
        while (counts < targets).any():
            action, state, _ = policy.act(obs_to_tensor(obs), state, deterministic)
            act = check_act_output(agent, action, num_envs, space)
            if isinstance(space, gym.spaces.Box):
                act = np.clip(act, space.low, space.high)
            obs, rew, term, trunc, infos = env.step(act)
            ep_ret += rew
            ep_len += 1
            cut = ep_len >= max_episode_steps
            done = term | trunc | cut
            if done.any():
                final_info = infos.get("final_info", {}) or {}
                succ, succ_mask = final_info.get("success"), final_info.get("_success")
                for i in np.flatnonzero(done):
                    if counts[i] < targets[i]:
                        returns.append(float(ep_ret[i]))
                        lengths.append(int(ep_len[i]))
                        if succ is not None and (succ_mask is None or succ_mask[i]):
                            successes.append(float(bool(succ[i])))
                        counts[i] += 1
                ep_ret[done] = 0
                ep_len[done] = 0
                if cut.any():  # envs that never end on their own: restart all, drop partial episodes
                    obs, _ = env.reset(seed=seed + int(counts.sum()) + 1)
                    ep_ret[:] = 0
                    ep_len[:] = 0
                    state = agent.get_initial_state(num_envs)
                elif state is not None:
                    state = reset_state(state, initial, torch.from_numpy(done))
    finally:
        env.close()
    return {
        "episodes": len(returns),
        "return_mean": float(np.mean(returns)),
        "return_std": float(np.std(returns)),
        "length_mean": float(np.mean(lengths)),
        "success_rate": float(np.mean(successes)) if successes else None,
        "deterministic": deterministic,
        "seed": seed,
        "returns": returns,
        "lengths": lengths,
    }
