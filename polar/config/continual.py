"""Continual learning sections of an env run (see docs/offline.md, "Continual learning"):

- ``init: {source: PATH}``: start an online run (PPO/APPO/DQN/SAC) from the weights of an earlier run: an
  offline one (BC/IQL), a prior online run, or a ``polar export`` folder (its manifest names the run and checkpoint);
- ``replay_mix: {dataset: ID|PATH, ratio: 0.5}``: DQN/SAC draw ``ratio`` of every sampled batch from an old
  dataset and the rest from the run's own replay buffer;
- ``eval.old_tasks: [...]``: the env variants of the old task, evaluated at the start and with every evaluation;
  ``old_task/return`` and ``forgetting`` (start - current) are logged.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from polar.config.base import StrictModel
from polar.config.harness import CustomHarnessConfig, GymnasiumHarnessConfig


class InitConfig(StrictModel):
    """Where an online run's starting weights come from (only for a fresh run: ``polar resume`` reads its own
    checkpoint)."""

    source: str = Field(..., min_length=1, description="a run directory (its latest checkpoint), a checkpoint "
                        "file inside one, or a polar export folder (manifest.json); relative to the config file")


class ReplayMixConfig(StrictModel):
    """DQN/SAC: every sampled batch takes ``round(ratio * batch_size)`` transitions from ``dataset`` (uniformly) and
    the rest from the run's own replay buffer."""

    dataset: str = Field(..., min_length=1, description="Minari dataset: a folder (relative to the config file) or a "
                         "local id under MINARI_DATASETS_PATH; polar collect writes one")
    ratio: float = Field(0.5, gt=0, lt=1, description="share of each batch drawn from the old dataset")


class OldTaskConfig(StrictModel):
    """An old task to measure forgetting on: the run's own harness with another ``id`` and/or ``kwargs``
    (gymnasium harnesses), or a whole ``harness`` section."""

    name: str | None = Field(None, min_length=1, description="metric name: old_task/<name>/return; default the id")
    id: str | None = Field(None, min_length=1, description="gymnasium id (default: the run's harness id)")
    kwargs: dict[str, Any] | None = Field(None, description="gymnasium kwargs, replacing the run's harness kwargs")
    harness: Annotated[GymnasiumHarnessConfig | CustomHarnessConfig, Field(discriminator="type")] | None = Field(
        None, description="a whole harness section instead of id/kwargs")

    @model_validator(mode="after")
    def _one_form(self) -> OldTaskConfig:
        if self.harness is not None and (self.id is not None or self.kwargs is not None):
            raise ValueError("an old task gives either harness or id/kwargs, not both")
        if self.harness is None and self.id is None and self.kwargs is None:
            raise ValueError("an old task needs id and/or kwargs (a variant of the run's gymnasium harness), or harness")
        return self


def old_task_harness(run_harness: Any, task: OldTaskConfig) -> Any:
    """The harness section ``task`` names: its own ``harness``, or the run's gymnasium harness with ``id`` and/or
    ``kwargs`` replaced."""
    if task.harness is not None:
        return task.harness
    update: dict[str, Any] = {}
    if task.id is not None:
        update["id"] = task.id
    if task.kwargs is not None:
        update["kwargs"] = dict(task.kwargs)
    return run_harness.model_copy(update=update)


def old_task_names(run_harness: Any, tasks: list[OldTaskConfig]) -> list[str]:
    """Metric names of ``tasks``: ``name``, else the id (``id-2``, ... when ids repeat)."""
    names: list[str] = []
    for i, task in enumerate(tasks):
        name = task.name or str(getattr(old_task_harness(run_harness, task), "id", None) or f"task{i}")
        if task.name is None and name in names:
            name = f"{name}-{i}"
        names.append(name)
    return names
