"""Buffers: the on-policy rollout buffer (PPO/APPO batches)."""

from polar.buffers.rollout_buffer import Minibatch, RolloutBuffer

__all__ = ["Minibatch", "RolloutBuffer"]
