"""Continual learning sections of an env run (see docs/offline.md, "Continual learning"):

- ``init: {source: PATH}``: start an online run (PPO/APPO/DQN/SAC) from the weights of an earlier run: an
  offline one (BC/IQL), a prior online run, or a ``polar export`` folder (its manifest names the run and checkpoint);
- ``replay_mix: {dataset: ID|PATH, ratio: 0.5}``: DQN/SAC draw ``ratio`` of every sampled batch from an old
  dataset and the rest from the run's own replay buffer;
- ``eval.old_tasks: [...]``: the env variants of the old task, evaluated at the start and with every evaluation;
  ``old_task/return`` and ``forgetting`` (start - current) are logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, model_validator

from polar.config.base import StrictModel
from polar.config.harness import CustomHarnessConfig, GymnasiumHarnessConfig

if TYPE_CHECKING:  # run.py imports this module
    from polar.config.run import EnvRunConfig


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


def check_continual(cfg: EnvRunConfig, online: tuple[str, ...], off_policy: tuple[str, ...]) -> None:
    """Cross-section rules of ``init``, ``replay_mix`` and ``eval.old_tasks`` on an env run; ValueError naming the key and the fix."""
    algo = cfg.policy.type
    if cfg.init is not None and algo not in online:
        raise ValueError(f"init: starts an online run ({', '.join(online)}) from earlier weights; policy.type {algo!r} "
                         "trains from a dataset. Remove init")
    if cfg.replay_mix is not None:
        if algo not in off_policy:
            raise ValueError(
                f"replay_mix: policy.type {algo!r} learns on-policy, from rollouts of its current weights only; old "
                f"transitions would be off-policy data in its update. Use {' or '.join(off_policy)} for a replay mix, "
                "or remove replay_mix (init alone starts PPO/APPO from the old weights)")
        if getattr(cfg.policy.kwargs, "prioritized_replay", False):
            raise ValueError("replay_mix: prioritized replay is not mixed (the old dataset has no priorities); set "
                             "policy.kwargs.prioritized_replay: false or remove replay_mix")
    tasks = cfg.eval.old_tasks
    if tasks:
        if algo not in online:
            raise ValueError(f"eval.old_tasks: measures forgetting in online runs ({', '.join(online)}); policy.type "
                             f"{algo!r} trains from a dataset. Remove eval.old_tasks")
        for i, task in enumerate(tasks):
            if task.harness is None and cfg.harness.type != "gymnasium":
                raise ValueError(f"eval.old_tasks[{i}]: id/kwargs vary a gymnasium harness, and this run's is "
                                 f"harness.type {cfg.harness.type}; give the old task a whole harness section")
        names = old_task_names(cfg.harness, tasks)
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"eval.old_tasks: the name {dup[0]!r} is used twice; give each old task its own name")
