"""``distribution.num_learners: N``: N data-parallel learner processes as Ray actors, one ``torch.distributed`` group.

:class:`LearnerGroup` stands where one algorithm learner stood (``update``/``state_dict``/``load_state_dict``). The
driver keeps its own copy of the learner (``local``), which acts, publishes and is checkpointed as before; each
``update`` splits the batch into N shards (``shard``), every rank trains on its shard with the gradient averaged by
``torch.distributed`` before each optimizer step (:mod:`polar.distributed.data_parallel`), and rank 0's weights
are copied into ``local``: they are what is published.

Failure: every wait on the ranks is bounded (``update_timeout_s``) and the process group's own ``timeout=`` turns a
collective a peer never joins into an error. A rank that dies or hangs makes the group kill every rank, start a
fresh group, load the last checkpoint the group produced (or the weights it started from) into it, and retry the
batch, up to ``max_restarts`` times; then it raises.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from polar.buffers.rollout_buffer import RolloutBuffer
from polar.config.sections import DistributionConfig
from polar.distributed.cluster import RoleRequest, alive_nodes, check_placeable
from polar.distributed.data_parallel import (
    GradientAverager,
    init_learner_group,
    leave_learner_group,
    shard_fragments,
)
from polar.errors import DistributedError
from polar.types import Batch, Metrics, Rollout

log = logging.getLogger(__name__)

T = TypeVar("T")


class SyncedLearner(Protocol):
    """An algorithm learner with the data-parallel hook (PPOLearner, APPOLearner, GRPOLearner, SFTLearner)."""

    grad_sync: Callable[[Sequence[nn.Parameter], float], float] | None

    def update(self, batch: Any, /) -> Any: ...

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> None: ...


L = TypeVar("L", bound=SyncedLearner)


@dataclass(frozen=True)
class GroupSpec:
    """How many ranks, where they go, and how long anything may take."""

    num_learners: int
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: Mapping[str, float] | None = None
    collective_timeout_s: float = 60.0
    update_timeout_s: float = 600.0
    max_restarts: int = 3
    config_key: str = "distribution.num_learners"


def group_spec(d: DistributionConfig) -> GroupSpec:
    """The group's shape from ``distribution``: ``num_learners`` ranks placed by ``learner_resources``."""
    r = d.learner_resources
    return GroupSpec(d.num_learners, r.num_cpus, r.num_gpus, dict(r.resources), collective_timeout_s=d.learner_timeout_s,
                     update_timeout_s=d.learner_timeout_s, max_restarts=d.max_learner_restarts)


def shard_rollout(batch: Batch[Rollout], rank: int, world_size: int) -> Batch[Rollout]:
    """PPO/APPO: this rank's env columns (GAE runs per column, so a column is never split)."""
    r = batch.data
    fragments = shard_fragments(r.fragments, rank, world_size)
    buffer = RolloutBuffer(fragments) if r.buffer is not None else None  # PPO trains on one; APPO does not
    return replace(batch, data=Rollout(fragments, r.reward_scale, r.reward_clip, buffer=buffer))


def shard_groups(batch: Batch[Any], rank: int, world_size: int,
                 signal: Callable[[Any], bool] = lambda group: True) -> Batch[Any]:
    """GRPO: this rank's whole session groups (a group's advantage needs all its sessions), dealt round-robin with
    the groups that carry ``signal`` first (GRPO: ``has_signal``), so every rank gets its share of the groups it can learn
    from (a rank with none takes the group's steps with weight 0: ``GRPOLearner._zero_weight_steps``)."""
    groups = list(batch.data)
    order = sorted(range(len(groups)), key=lambda i: not signal(groups[i]))  # stable: signal first
    return replace(batch, data=[groups[i] for i in order[rank::world_size]])


def shard_samples(batch: Batch[list[T]], rank: int, world_size: int) -> Batch[list[T]]:
    """SFT: this rank's share of a minibatch of demonstrations, dealt round-robin from rank 0, so rank 0 (whose
    metrics the group reports) has one whenever the minibatch does; a rank dealt none steps with weight 0."""
    return replace(batch, data=list(batch.data[rank::world_size]))


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Rank:
    """One learner process (a Ray actor): its learner, in a torch.distributed group with the others."""

    def __init__(self, make: Callable[[], SyncedLearner], module_of: Callable[[Any], nn.Module]) -> None:
        torch.set_num_threads(1)
        self.learner = make()
        self.module_of = module_of

    def address(self) -> tuple[str, int]:
        import ray

        host = ray.util.get_node_ip_address()
        return host, _free_port(host)

    def join(self, rank: int, world_size: int, init_method: str, timeout_s: float) -> int:
        init_learner_group(rank, world_size, init_method, torch.device("cpu"), timeout_s)
        self.learner.grad_sync = GradientAverager()
        return rank

    def update(self, batch: Any) -> Any:
        return self.learner.update(batch)

    def module_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.module_of(self.learner).state_dict().items()}

    def state_dict(self) -> Any:
        return self.learner.state_dict()

    def load(self, state: Any, module_state: Mapping[str, torch.Tensor] | None) -> None:
        if module_state is not None:
            self.module_of(self.learner).load_state_dict(dict(module_state))
        if state is not None:
            self.learner.load_state_dict(state)

    def pid(self) -> int:
        import os

        return os.getpid()

    def close(self) -> None:
        leave_learner_group()


class LearnerGroup(Generic[L]):
    """N ranks of ``make()`` trained data-parallel; ``local`` is the driver's copy (rank 0's weights after each
    update). ``module_of(learner)`` is the module whose weights are published (PPO, APPO: ``.agent``; GRPO, SFT:
    ``.policy.model``)."""

    def __init__(self, local: L, make: Callable[[], L], module_of: Callable[[Any], nn.Module],
                 shard: Callable[[Batch[Any], int, int], Batch[Any]], spec: GroupSpec) -> None:
        self.local = local
        self.make = make
        self.module_of = module_of
        self.shard = shard
        self.spec = spec
        self.restarts = 0
        self._checkpoint: tuple[Any, dict[str, torch.Tensor]] | None = None
        self.ranks: list[Any] = []
        self._check_fits()

    def _ensure_started(self) -> None:
        """The ranks start at first use, from the driver's weights then: a stage before this learner's (GRPO's SFT
        warm-up) has trained them by that time, and its own group has been closed."""
        if not self.ranks:
            state, module_state = self._checkpoint if self._checkpoint is not None else (None, None)
            self._start(state, module_state if module_state is not None else self._local_module_state())

    # ------------------------------------------------------------------ the ranks
    def _check_fits(self) -> None:
        """Refuse at start, naming the key, what the cluster cannot place (else the ranks would wait forever)."""
        import ray

        spec = self.spec
        have = ray.cluster_resources()
        need_cpu, need_gpu = spec.num_learners * spec.num_cpus, spec.num_learners * spec.num_gpus
        if need_cpu > have.get("CPU", 0.0) or need_gpu > have.get("GPU", 0.0):
            raise DistributedError(
                f"{spec.config_key}: {spec.num_learners} learners x (num_cpus={spec.num_cpus:g}, "
                f"num_gpus={spec.num_gpus:g}) need CPU={need_cpu:g} GPU={need_gpu:g}, but the cluster has "
                f"CPU={have.get('CPU', 0.0):g} GPU={have.get('GPU', 0.0):g}; lower {spec.config_key} or "
                f"distribution.learner_resources, or add nodes")
        check_placeable([RoleRequest("learner", spec.num_learners, spec.num_cpus, spec.num_gpus,
                                     "distribution.learner_resources", dict(spec.resources or {}))],
                        alive_nodes(), require_total=False)

    def _local_module_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.module_of(self.local).state_dict().items()}

    def _get(self, refs: Any, what: str) -> Any:
        import ray

        try:
            return ray.get(refs, timeout=self.spec.update_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise DistributedError(f"learner group: {what} took over {self.spec.update_timeout_s:g} s "
                                   f"(a learner hung in a collective?)") from None
        except ray.exceptions.RayError as e:
            raise DistributedError(f"learner group: a learner failed during {what}: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}") from None

    def _start(self, state: Any, module_state: Mapping[str, torch.Tensor] | None) -> None:
        import ray

        spec = self.spec
        actor = ray.remote(_Rank).options(num_cpus=spec.num_cpus, num_gpus=spec.num_gpus,
                                          resources=dict(spec.resources or {}), max_restarts=0)
        self.ranks = [actor.remote(self.make, self.module_of) for _ in range(spec.num_learners)]
        host, port = self._get(self.ranks[0].address.remote(), "start")
        init = f"tcp://{host}:{port}"
        self._get([r.join.remote(i, spec.num_learners, init, spec.collective_timeout_s)
                   for i, r in enumerate(self.ranks)], "joining the process group")
        self._get([r.load.remote(state, module_state) for r in self.ranks], "loading the start state")
        log.info("learner group: %d ranks joined %s (gloo)", spec.num_learners, init)

    def _kill(self) -> None:
        import ray

        for r in self.ranks:
            ray.kill(r, no_restart=True)
        self.ranks = []

    def _restart(self, why: DistributedError) -> None:
        if self.restarts >= self.spec.max_restarts:
            self._kill()
            raise DistributedError(f"{why}; the group was restarted {self.restarts} times already "
                                   f"(distribution.max_learner_restarts): giving up") from None
        self.restarts += 1
        log.warning("%s; restarting the learner group from the last checkpoint (restart %d of %d)", why,
                    self.restarts, self.spec.max_restarts)
        self._kill()
        state, module_state = self._checkpoint if self._checkpoint is not None else (None, None)
        if module_state is None:
            module_state = self._local_module_state()
        else:
            self.module_of(self.local).load_state_dict(module_state)
        self._start(state, module_state)

    # ------------------------------------------------------------------ the algorithm learner
    def update(self, batch: Batch[Any], /) -> Metrics:
        n = self.spec.num_learners
        shards = [self.shard(batch, i, n) for i in range(n)]  # a batch it cannot split raises here, not a restart
        self._ensure_started()
        while True:
            try:
                results = self._get([r.update.remote(s) for r, s in zip(self.ranks, shards, strict=True)],
                                    "an update")
                weights = self._get(self.ranks[0].module_state.remote(), "reading rank 0's weights")
                break
            except DistributedError as e:
                self._restart(e)
        with torch.no_grad():
            self.module_of(self.local).load_state_dict(weights)
        out: Metrics = dict(results[0])
        out["learner_group_restarts"] = self.restarts
        return out

    def weights(self) -> Mapping[str, Any]:
        """What is published: the driver's copy, which holds rank 0's weights (a GRPO learner's serving weights)."""
        weights = getattr(self.local, "weights", None)
        return weights() if callable(weights) else self.module_of(self.local).state_dict()

    def state_dict(self) -> Any:
        """Rank 0's state; with no ranks running (not started yet, or closed) the state they left, or the driver's
        copy's (the ranks start from it), so a checkpoint never starts a group."""
        if not self.ranks:
            if self._checkpoint is not None and self._checkpoint[0] is not None:
                return self._checkpoint[0]
            return self.local.state_dict()
        state = self._get(self.ranks[0].state_dict.remote(), "checkpointing")
        self._checkpoint = (state, self._local_module_state())
        return state

    def load_state_dict(self, state: Any, /) -> None:
        self.local.load_state_dict(state)
        module_state = self._local_module_state()
        self._checkpoint = (state, module_state)
        if self.ranks:  # else they start from it
            self._get([r.load.remote(state, module_state) for r in self.ranks], "loading a checkpoint")

    def close(self) -> None:
        """End the ranks (their processes exit and their resources return to the cluster), keeping rank 0's state:
        an SFT run checkpoints after its stage closed the group, and a later ``update`` starts from it."""
        if self.ranks:
            try:
                self.state_dict()
            except DistributedError as e:  # a broken group: its last checkpoint stays what a restart loads
                log.warning("learner group: closing without rank 0's state (%s)", e)
        self._kill()


__all__ = ["GroupSpec", "LearnerGroup", "SyncedLearner", "group_spec", "shard_groups", "shard_rollout", "shard_samples"]
