"""Env episodes for an evaluation: one episode per held-out seed, ``num_envs`` single envs stepped together.

Episode ``k`` is reset with ``seeds[k]`` and runs to its end on one env, so its outcome depends only on
its seed and the policy, not on how episodes were spread over envs or processes: a direct loop over the
same seeds gives the same numbers. The episodes are played by the one env-episode loop
(``polar.rollout.episodes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from polar.rollout.episodes import Actor, EnvSlots, EpisodePlan, run_episodes


def run_env_episodes(actor: Actor, envs: list[gym.Env[Any, Any]], seeds: list[int], deterministic: bool = True,
                     max_episode_steps: int = 100_000, info_keys: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One record per seed, in seed order: ``seed``, ``return``, ``episode_length``, ``success`` (the final
    ``info["success"]``, None when absent), ``terminated``, ``truncated``, ``time_to_completion_s`` (the
    episode's env step time plus its share of the batched forward passes) and ``info_counts``."""
    results = run_episodes(actor, EnvSlots(envs), EpisodePlan.seeded(seeds), deterministic=deterministic,
                           max_episode_steps=max_episode_steps, info_keys=info_keys)
    return [{"seed": r.seed, "return": r.ret, "episode_length": r.length, "success": r.success,
             "terminated": r.terminated, "truncated": r.truncated, "time_to_completion_s": r.time_s,
             "info_counts": r.info_counts} for r in sorted(results, key=lambda r: r.episode)]


def make_envs(make_one: Callable[[], gym.Env[Any, Any]], count: int) -> list[gym.Env[Any, Any]]:
    """``count`` envs from ``make_one``; the ones already built are closed if a later one fails."""
    envs: list[gym.Env[Any, Any]] = []
    try:
        for _ in range(count):
            envs.append(make_one())
    except BaseException:
        for e in envs:
            e.close()
        raise
    return envs
