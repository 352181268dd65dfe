"""Behaviour cloning of a classic agent from a dataset (``policy: {type: bc, kwargs: {dataset: ...}}``).

Offline algorithms (BC, IQL) train from ``kwargs.dataset`` (a Minari dataset folder or local id) with no env
interaction; the env harness is used only to check the spaces and to evaluate. Their budget is
``gradient_steps``, not ``total_env_steps``.
"""

from __future__ import annotations

from pydantic import Field

from polar.config.base import StrictModel


class OfflineKwargs(StrictModel):
    dataset: str = Field(..., min_length=1, description="Minari dataset: a folder (with data/metadata.json), relative "
                         "to the config file, or a local id under MINARI_DATASETS_PATH; polar collect writes one")
    gradient_steps: int = Field(10_000, ge=1, description="the run's budget: gradient steps in total")
    steps_per_iteration: int = Field(1000, ge=1, description="gradient steps per iteration (a metrics row)")
    batch_size: int = Field(256, ge=1)
    learning_rate: float = Field(3e-4, gt=0)
    max_grad_norm: float | None = Field(None, gt=0)
    normalize_obs: bool = Field(False, description="standardise Box observations by the dataset's mean/std (computed "
                                "once, frozen, saved with checkpoints: eval, export and serve apply them)")
    clip_obs: float = Field(10.0, gt=0, description="normalised observations are clipped to +-this")


class BCKwargs(OfflineKwargs):
    """Maximum likelihood of the dataset's actions under the agent's action distribution."""
