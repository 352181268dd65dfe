"""What every env run is composed of besides its algorithm: the env side (a rollout backend, or for offline
runs the env's spaces), the acting policy and the learner's copy of it, the learner wrapper that publishes and
checkpoints the policy (the evaluator is ``polar.trainers.evaluation.EnvEvaluator``). ``polar.trainers.build``
puts them together with the algorithm's registry row; nothing here knows an algorithm.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import gymnasium as gym
import torch

from polar.config.run import EnvRunConfig
from polar.models.policy import Policy
from polar.rollout.backends.base import RolloutBackend
from polar.trainers.continual import Continual
from polar.trainers.device import copy_weights
from polar.trainers.loop import close_learner
from polar.trainers.run_dir import RunDir
from polar.types import Batch, Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class AlgorithmLearner(Protocol[T_contra]):
    """An algorithm's learner (``polar.algorithms``): the update and its own state (optimizer, targets)."""

    def update(self, batch: Batch[T_contra], /) -> Metrics: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class EnvParts:
    """An env run's parts, built in this order by ``polar.trainers.build``: the env side (``backend``, or only the
    spaces for a dataset run), the acting ``policy`` and ``train_agent`` (the same module on CPU, a copy on the
    learner's device otherwise). The registry row's ``make_learner``/``make_collector`` read them."""

    cfg: EnvRunConfig
    run_dir: RunDir
    seed: int  # the env seed of this start (fresh seeds on resume)
    device: torch.device
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    policy: Policy
    train_agent: torch.nn.Module
    backend: RolloutBackend | None = None
    state: Mapping[str, Any] | None = None
    continual: Continual | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir.checkpoints_dir

    def sync_acting_policy(self) -> None:
        """The learner's weights into the acting (CPU) policy; nothing to do when the learner trains it in place."""
        copy_weights(self.policy.agent, self.train_agent)


class PolicyLearner(Generic[T]):
    """An env run's ``Learner``: the algorithm's learner plus the policy it trains. ``weights`` are the acting
    policy's (synced from the learner's device; ``{}`` when the envs step in the learner and act with its own
    tensors); the checkpoint holds ``policy`` and ``learner`` (and ``continual``, the start measurements)."""

    def __init__(self, parts: EnvParts, algorithm: AlgorithmLearner[T], publish: bool = True) -> None:
        self.parts = parts
        self.algorithm = algorithm
        self.publish = publish

    def update(self, batch: Batch[T]) -> Metrics:
        self.parts.policy.train()
        return self.algorithm.update(batch)

    def weights(self) -> Mapping[str, Any]:
        self.parts.sync_acting_policy()
        backend = self.parts.backend
        return self.parts.policy.state_dict() if self.publish and backend is not None and backend.num_workers else {}

    def state_dict(self) -> dict[str, Any]:
        self.parts.sync_acting_policy()
        continual = self.parts.continual
        return {"policy": self.parts.policy.state_dict(), "learner": self.algorithm.state_dict(),
                **({"continual": continual.state_dict()} if continual is not None else {})}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.parts.policy.load_state_dict(state["policy"])
        copy_weights(self.parts.train_agent, self.parts.policy.agent)
        self.algorithm.load_state_dict(state["learner"])
        if self.parts.continual is not None:
            self.parts.continual.load_state_dict(state.get("continual"))

    def close(self) -> None:
        """End the algorithm's processes (a learner group's ranks); the loop calls it when the run ends."""
        close_learner(self.algorithm)
