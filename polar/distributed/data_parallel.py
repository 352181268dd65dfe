"""Data-parallel learning: N learner processes, one ``torch.distributed`` process group, one batch split N ways.

Each learner trains on its shard of the batch (PPO/APPO: a slice of the env columns; GRPO: whole session groups, so
group advantages stay what one learner computes; SFT: its share of the demonstrations) and, before every optimizer step,
calls :class:`GradientAverager` through the learner's ``grad_sync`` hook. The averager does one ``all_reduce`` (gloo
on CPU, NCCL on GPU: torch's collective, not a home-made one) of ``grad * weight`` with ``weight`` appended, then
divides by the summed weight. ``weight`` is what the learner's loss divides by on its shard (PPO: the minibatch's
samples; SFT and GRPO ``token_mean``: its tokens; GRPO otherwise: its sequences), so the averaged gradient is the gradient
one learner computes on the whole batch, and N learners on one batch take the step one learner takes (tested).

The group is bounded in time: ``init_process_group(timeout=)`` makes a collective that a dead or hung peer never
joins raise instead of waiting forever.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from polar.errors import DistributedError
from polar.types import Fragment

LEARNER_SHARDING = ("none", "fsdp")


def backend_for(device: torch.device) -> str:
    """gloo for CPU learners, NCCL for CUDA ones."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_learner_group(rank: int, world_size: int, init_method: str, device: torch.device,
                       timeout_s: float) -> None:
    """Join the learners' process group (``init_method``: ``tcp://host:port`` of rank 0). A collective that a peer
    does not join within ``timeout_s`` raises (torch.distributed's own timeout), so a hung learner is detected."""
    if dist.is_initialized():
        raise DistributedError("this process already belongs to a torch.distributed group; one learner per process")
    kwargs: dict[str, object] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(backend_for(device), init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kwargs)  # type: ignore[arg-type]


def leave_learner_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class GradientAverager:
    """The ``grad_sync`` hook: after the local backward, before clipping and the optimizer step, every learner's
    gradient becomes the weighted mean over the group (weights: what each learner's loss was normalized by).
    Returns the group's total weight: 0 when no learner had data, and then no learner steps."""

    def __call__(self, params: Sequence[torch.nn.Parameter], local_weight: float) -> float:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        device = grads[0].device if grads else torch.device("cpu")
        dtype = torch.float64 if device.type == "cpu" else torch.float32
        flat = torch.cat([g.reshape(-1).to(dtype) * local_weight for g in grads]
                         + [torch.tensor([local_weight], dtype=dtype, device=device)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        total = float(flat[-1])
        if total <= 0:  # no learner had data in this minibatch: nothing to step on
            flat.zero_()
        else:
            flat /= total
        off = 0
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                k = g.numel()
                g.copy_(flat[off:off + k].view_as(g))
                if p.grad is None:
                    p.grad = g
                off += k
        return total


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[lo, hi)`` of ``n`` items for ``rank``: contiguous, sizes differ by at most one."""
    return rank * n // world_size, (rank + 1) * n // world_size


def _cols(x: object, lo: int, hi: int, axis: int) -> object:
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: _cols(v, lo, hi, axis) for k, v in x.items()}
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], np.ndarray):
        return type(x)(_cols(v, lo, hi, axis) for v in x)
    if isinstance(x, np.ndarray):
        return x[:, lo:hi] if axis == 1 else x[lo:hi]
    return x


def shard_fragments(fragments: Sequence[Fragment], rank: int, world_size: int) -> list[Fragment]:
    """This learner's env columns of a PPO/APPO batch: the batch's columns (all fragments side by side) split into
    ``world_size`` contiguous slices. Episode statistics stay with the whole batch (the driver logs them)."""
    total = sum(f.num_envs for f in fragments)
    if total < world_size:
        raise DistributedError(
            f"distribution.num_learners is {world_size} but a batch has only {total} env columns; each learner "
            f"needs at least one: lower num_learners or raise the env count")
    lo, hi = shard_bounds(total, rank, world_size)
    out: list[Fragment] = []
    start = 0
    for f in fragments:
        a, b = max(lo, start) - start, min(hi, start + f.num_envs) - start
        start += f.num_envs
        if a >= b:
            continue
        out.append(dataclasses.replace(
            f, obs=_cols(f.obs, a, b, 1), actions=f.actions[:, a:b], log_probs=f.log_probs[:, a:b],
            values=f.values[:, a:b], rewards=f.rewards[:, a:b], terminated=f.terminated[:, a:b],
            truncated=f.truncated[:, a:b], episode_starts=f.episode_starts[:, a:b],
            trunc_values=f.trunc_values[:, a:b], last_values=f.last_values[a:b],
            initial_state=_cols(f.initial_state, a, b, 0), next_obs=_cols(f.next_obs, a, b, 1)))
    return out


__all__ = ["LEARNER_SHARDING", "GradientAverager", "backend_for", "init_learner_group", "leave_learner_group",
           "shard_bounds", "shard_fragments"]
