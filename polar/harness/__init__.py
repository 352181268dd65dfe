"""Harnesses: anything that produces episodes.

The env contract is Gymnasium's. The batched form is a ``gymnasium.vector.VectorEnv`` with
SAME_STEP autoreset: when a sub-env's episode ends at ``step``, the observation returned for it is
already the first observation of its next episode, and the true final observation is in
``infos["final_obs"][i]`` (with ``infos["_final_obs"][i] == True``); ``infos["final_info"]`` holds
the final step's info. Learners bootstrap truncated episodes from ``final_obs``.

``type: envpool`` harnesses are EnvPool's C++ vector envs, converted to this contract
(``polar.harness.envpool_adapter``).

``type: custom`` harnesses run in connector processes (``polar.harness.connector``): a restarted
connector ends each interrupted episode as truncated with ``info["polar/connector_restart"] = True``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym

if TYPE_CHECKING:
    from polar.config.run import AnyHarnessConfig

__all__ = ["make_env", "make_vector_env"]


def make_vector_env(harness_cfg: AnyHarnessConfig, num_envs: int, seed: int | None = None, config_dir: Path | None = None,
                    worker_index: int = 0) -> gym.vector.VectorEnv:
    """Build ``num_envs`` copies of a harness as one SAME_STEP-autoreset vector env.

    ``worker_index`` says which rollout worker hosts them (0: the learner, evaluation, checks; 1..N:
    rollout workers); connector copies see it, with their own seed, in their config."""
    if harness_cfg.type == "gymnasium":
        from polar.harness.gymnasium_adapter import make_gymnasium_vector_env

        envs = make_gymnasium_vector_env(harness_cfg, num_envs)
        if seed is not None:  # later reset() calls continue these seeded RNGs: runs are reproducible
            envs.reset(seed=seed)
            envs.action_space.seed(seed)
        return envs
    if harness_cfg.type == "envpool":  # C++ vector envs, NEXT_STEP autoreset turned SAME_STEP
        from polar.harness.envpool_adapter import make_envpool_vector_env

        return make_envpool_vector_env(harness_cfg.id, num_envs, harness_cfg.kwargs, seed)
    if harness_cfg.type == "custom":
        from polar.harness.connector.vector_env import ConnectorVectorEnv

        return ConnectorVectorEnv(harness_cfg.connector_spec, num_envs, seed=seed, config_dir=config_dir,
                                  worker_index=worker_index)
    raise NotImplementedError(f"harness type {harness_cfg.type!r} has no vector env")


def make_env(harness_cfg: AnyHarnessConfig, config_dir: Path | None = None) -> gym.Env:
    """Build one copy of a harness as a Gymnasium env."""
    if harness_cfg.type == "gymnasium":
        from polar.harness.gymnasium_adapter import make_gymnasium_env

        return make_gymnasium_env(harness_cfg)
    if harness_cfg.type == "envpool":
        from polar.harness.envpool_adapter import make_envpool_env

        return make_envpool_env(harness_cfg.id, harness_cfg.kwargs)
    if harness_cfg.type == "custom":
        from polar.harness.connector.vector_env import ConnectorEnv

        return ConnectorEnv(harness_cfg.connector_spec, config_dir=config_dir)
    raise NotImplementedError(f"harness type {harness_cfg.type!r} has no single env")
