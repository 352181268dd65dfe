"""Any registered Gymnasium id from YAML, with a "did you mean" list for unknown ids."""

from __future__ import annotations

import gymnasium as gym

from polar.config.base import did_you_mean
from polar.errors import ConfigError


def _check_id(env_id: str) -> None:
    if env_id not in gym.registry:
        raise ConfigError(
            f"harness.id: unknown Gymnasium id {env_id!r}{did_you_mean(env_id, list(gym.registry))}. "
            "Register it first (import its package) or fix the id."
        )


def make_gymnasium_env(cfg) -> gym.Env:
    _check_id(cfg.id)
    return gym.make(cfg.id, **cfg.kwargs)


def make_gymnasium_vector_env(cfg, num_envs: int) -> gym.vector.VectorEnv:
    _check_id(cfg.id)
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(cfg.id, **cfg.kwargs) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
