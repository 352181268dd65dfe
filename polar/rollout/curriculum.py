"""The curriculum collector (``curriculum:``, docs/exploration.md): an env collector whose env changes by stage.

It wraps the run's collector and counts the successes of the finished training episodes (the env's
``info["success"]``). Once the last ``window`` of them reach ``threshold`` and a later stage exists, it closes
the rollout backend, starts the next stage's (the same spaces, the acting weights of now), logs one line and
clears the window. ``curriculum/stage`` and ``curriculum/success_rate`` are logged every iteration; the stage
and the window are collector state, so a resumed run continues at the stage it was checkpointed in.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from polar.config.curriculum import CurriculumConfig, stage_label
from polar.errors import ConfigError
from polar.rollout.backends.base import RolloutBackend
from polar.types import Batch, Collector, Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

StageBackend = Callable[[int], RolloutBackend]
"""Builds (not starts) the rollout backend of a stage."""


class CurriculumCollector(Generic[T]):
    """``inner`` collects from ``backend_of(stage)``; ``use_backend(stage, backend)`` puts a new stage's backend
    in its place (the collector's, the run's parts). ``stage``: the stage the inner collector's backend runs."""

    def __init__(self, inner: Collector[T], cfg: CurriculumConfig, stage: int, backend_of: StageBackend,
                 use_backend: Callable[[int, RolloutBackend], None]) -> None:
        self.inner = inner
        self.cfg = cfg
        self.stage = stage
        self.backend_of = backend_of
        self.use_backend = use_backend
        self.successes: deque[float] = deque(maxlen=cfg.window)
        self._weights: Mapping[str, Any] = {}
        self._version = 0
        self.advanced = 0  # stages advanced in this process (tests, the run's summary)

    @property
    def success_rate(self) -> float | None:
        return sum(self.successes) / len(self.successes) if self.successes else None

    def start(self, weights: Mapping[str, Any], version: int) -> None:
        self._weights, self._version = weights, version
        log.info("curriculum: stage %d of %d (%s)", self.stage, len(self.cfg.stages) - 1,
                 stage_label(self.cfg.stages[self.stage], self.stage))
        self.inner.start(weights, version)

    def collect(self) -> Batch[T]:
        batch = self.inner.collect()
        self.successes.extend(float(s) for s in batch.episode_successes)
        rate = self.success_rate
        if (self.stage + 1 < len(self.cfg.stages) and len(self.successes) >= self.cfg.window and rate is not None
                and rate >= self.cfg.threshold):
            self._advance(rate)
        return batch

    def _advance(self, rate: float) -> None:
        nxt = self.stage + 1
        log.info("curriculum: success rate %.3f over the last %d episodes reached %.3g: stage %d (%s) -> %d (%s)",
                 rate, len(self.successes), self.cfg.threshold, self.stage,
                 stage_label(self.cfg.stages[self.stage], self.stage), nxt, stage_label(self.cfg.stages[nxt], nxt))
        backend = self.backend_of(nxt)
        self.inner.close()
        self.use_backend(nxt, backend)
        self.stage = nxt
        self.successes.clear()
        self.advanced += 1
        self.inner.start(self._weights, self._version)

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        self._weights, self._version = weights, version
        self.inner.publish(weights, version)

    def metrics(self) -> Metrics:
        rate = self.success_rate
        return {**self.inner.metrics(), "curriculum/stage": self.stage,
                "curriculum/success_rate": rate}

    def close(self) -> None:
        self.inner.close()

    def state_dict(self) -> dict[str, Any]:
        return {**self.inner.state_dict(), "curriculum": {"stage": self.stage, "successes": list(self.successes)}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inner.load_state_dict(state)
        saved = state.get("curriculum")
        if saved is None:
            raise ConfigError("curriculum: the checkpoint has no curriculum state (its run had no curriculum "
                              "section); resume with the config it was trained with")
        if int(saved["stage"]) != self.stage:  # the compose step builds the backend of the saved stage
            raise ConfigError(f"curriculum: the checkpoint is at stage {saved['stage']}, the collector at {self.stage}")
        self.successes.extend(float(s) for s in saved["successes"])


def checkpoint_stage(state: Mapping[str, Any] | None, cfg: CurriculumConfig) -> int:
    """The stage a run resumes at (0 for a fresh run), checked against the config's stages."""
    if state is None or state.get("curriculum") is None:
        return 0
    stage = int(state["curriculum"]["stage"])
    if not 0 <= stage < len(cfg.stages):
        raise ConfigError(f"curriculum: the checkpoint is at stage {stage}, but curriculum.stages has "
                          f"{len(cfg.stages)}; resume with the config it was trained with")
    return stage


__all__ = ["CurriculumCollector", "StageBackend", "checkpoint_stage"]
