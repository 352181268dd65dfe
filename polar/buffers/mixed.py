"""Sampling one minibatch from two replay buffers in a fixed ratio (``replay_mix``; MBPO's real and model data)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from polar.buffers.replay_buffer import ReplayBatch
from polar.types import ReplaySampler


class MixedReplay:
    """One batch from two buffers: ``round(ratio * B)`` transitions from ``old`` (at least one, and at most B - 1)
    and the rest from ``new``; all from ``old`` while ``new`` is empty. Its length is ``new``'s.

    DQN/SAC with ``replay_mix`` (old: the dataset, new: the run's own buffer, so ``learning_starts`` counts new
    data); MBPO (old: the real buffer, new: the model buffer)."""

    def __init__(self, old: ReplaySampler, new: ReplaySampler, ratio: float) -> None:
        self.old = old
        self.new = new
        self.ratio = ratio
        self.sampled_old = 0
        self.sampled_new = 0

    def __len__(self) -> int:
        return len(self.new)

    def sample(self, batch_size: int, beta: float | None = None) -> ReplayBatch:
        n_old = min(batch_size - 1, max(1, round(self.ratio * batch_size))) if batch_size > 1 else 0
        if len(self.new) == 0:
            n_old = batch_size
        n_new = batch_size - n_old
        parts = [b.sample(n) for b, n in ((self.old, n_old), (self.new, n_new)) if n > 0]
        self.sampled_old += n_old
        self.sampled_new += n_new
        if len(parts) == 1:
            return parts[0]
        a, b = parts

        def cat(x: Any, y: Any) -> Any:
            if isinstance(x, dict):
                return {k: torch.cat([x[k], y[k]]) for k in x}
            return torch.cat([x, y])

        return ReplayBatch(obs=cat(a.obs, b.obs), actions=cat(a.actions, b.actions), rewards=cat(a.rewards, b.rewards),
                           next_obs=cat(a.next_obs, b.next_obs), terminated=cat(a.terminated, b.terminated),
                           weights=cat(a.weights, b.weights), steps=cat(a.steps, b.steps),
                           indices=np.concatenate([np.full(n_old, -1), b.indices]))

    def metrics(self) -> dict[str, Any]:
        total = max(1, self.sampled_old + self.sampled_new)
        return {"replay_mix/old_transitions": len(self.old), "replay_mix/old_fraction": self.sampled_old / total}
