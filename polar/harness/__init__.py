"""Harnesses: anything that produces episodes.

The env contract is Gymnasium's. The batched form is a ``gymnasium.vector.VectorEnv`` with
SAME_STEP autoreset: when a sub-env's episode ends at ``step``, the observation returned for it is
already the first observation of its next episode, and the true final observation is in
``infos["final_obs"][i]`` (with ``infos["_final_obs"][i] == True``); ``infos["final_info"]`` holds
the final step's info. Learners bootstrap truncated episodes from ``final_obs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym


def make_vector_env(harness_cfg: Any, num_envs: int, seed: int | None = None, config_dir: Path | None = None):
    """Build ``num_envs`` copies of a harness as one SAME_STEP-autoreset vector env."""
    if harness_cfg.type == "gymnasium":
        from polar.harness.gymnasium_adapter import make_gymnasium_vector_env

        return make_gymnasium_vector_env(harness_cfg, num_envs)
    raise NotImplementedError(f"harness type {harness_cfg.type!r} has no vector env yet")


def make_env(harness_cfg: Any, config_dir: Path | None = None) -> gym.Env:
    """Build one copy of a harness as a Gymnasium env."""
    if harness_cfg.type == "gymnasium":
        from polar.harness.gymnasium_adapter import make_gymnasium_env

        return make_gymnasium_env(harness_cfg)
    raise NotImplementedError(f"harness type {harness_cfg.type!r} has no single env yet")
