"""Buffers: the on-policy rollout buffer (PPO/APPO batches) and replay buffers (DQN/SAC)."""

from polar.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBatch, ReplayBuffer
from polar.buffers.rollout_buffer import Minibatch, RolloutBuffer

__all__ = ["Minibatch", "PrioritizedReplayBuffer", "ReplayBatch", "ReplayBuffer", "RolloutBuffer"]
