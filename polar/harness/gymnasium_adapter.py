"""Any registered Gymnasium id from YAML, with a "did you mean" list for unknown ids.

``id: module:EnvId`` imports ``module`` first (Gymnasium's own convention), so third-party envs
that register on import (``ale_py:ALE/Pong-v5``) also work with no code. TextArena's offline board games
are registered here as ``TextArena/<game>`` (``polar.harness.textarena_env``).
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym

from polar.config.base import did_you_mean
from polar.config.harness import GymnasiumHarnessConfig
from polar.errors import ConfigError
from polar.harness.action_mask import with_action_masks
from polar.harness.sync_vector import SameStepVectorEnv
from polar.harness.textarena_env import NAMESPACE, register_textarena_envs, unknown_game

register_textarena_envs()


def check_id(env_id: str) -> None:
    """``env_id`` is registered (after importing ``module`` of ``module:EnvId``), or one ``ConfigError``.

    ``polar run`` calls it before it creates anything, and every env factory here again."""
    if ":" in env_id:
        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"harness.id: cannot import {module!r} to register {env_id!r} ({e}); install it or fix the id") from None
    if env_id not in gym.registry:
        if env_id.startswith(f"{NAMESPACE}/"):
            raise ConfigError(unknown_game(env_id))
        raise ConfigError(
            f"harness.id: unknown Gymnasium id {env_id!r}{did_you_mean(env_id, list(gym.registry))}. "
            "Register it first (import its package, or write id: package:EnvId) or fix the id."
        )


def wrapper_class(name: str, index: int) -> type[gym.Wrapper[Any, Any, Any, Any]]:
    """The Gymnasium wrapper class ``harness.wrappers[index]`` names (``'module:Class'``), or one ``ConfigError``."""
    module, sep, attr = name.partition(":")
    where = f"harness.wrappers[{index}] {name!r}"
    if not sep or not module or not attr:
        raise ConfigError(f"{where}: write 'module:Class', e.g. 'minigrid.wrappers:ImgObsWrapper'")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ConfigError(f"{where}: cannot import {module!r} ({e}); install it or fix the name") from None
    except AttributeError:
        raise ConfigError(f"{where}: {module!r} has no {attr!r}; fix the name") from None
    if not (isinstance(cls, type) and issubclass(cls, gym.Wrapper)):
        raise ConfigError(f"{where} is not a gymnasium.Wrapper subclass; name a wrapper class")
    return cls


def check_wrappers(names: list[str]) -> None:
    """Every name in ``harness.wrappers`` is a wrapper class (``polar run`` checks before it creates anything)."""
    for i, name in enumerate(names):
        wrapper_class(name, i)


def _make(cfg: GymnasiumHarnessConfig) -> gym.Env:
    """One env; ``preset: atari`` wraps it in the standard Atari preprocessing (polar.harness.atari), then
    ``wrappers`` in order."""
    if cfg.preset == "atari":
        from polar.harness.atari import atari_base_kwargs, wrap_atari

        env: gym.Env = wrap_atari(gym.make(cfg.id, **atari_base_kwargs(cfg.id, cfg.kwargs)), cfg.atari)
    else:
        env = gym.make(cfg.id, **cfg.kwargs)
    for i, name in enumerate(cfg.wrappers):
        env = wrapper_class(name, i)(env)
    return env if cfg.preset == "atari" else with_action_masks(env, f"harness {cfg.id}")


def make_gymnasium_env(cfg: GymnasiumHarnessConfig) -> gym.Env:
    check_id(cfg.id)
    return _make(cfg)


def make_gymnasium_vector_env(cfg: GymnasiumHarnessConfig, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies in process, SAME_STEP autoreset (see ``polar.harness``): ``SyncVectorEnv``'s results,
    less work per step (``polar.harness.sync_vector``)."""
    check_id(cfg.id)
    return SameStepVectorEnv([lambda: _make(cfg) for _ in range(num_envs)])
