"""PPO and APPO on env harnesses: the on-policy Learner of ``polar.trainers.loop``.

PPO waits for a batch of one fragment per worker, computes advantages (``polar.algorithms.advantages``,
called by ``PPOLearner``) and runs its epochs; APPO learns from each fragment as it arrives (V-trace corrects
the lag) and drops fragments staler than ``max_policy_lag``. Resumable from the last checkpoint.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from polar.algorithms.appo import APPOLearner
from polar.algorithms.ppo import PPOLearner
from polar.buffers.rollout_buffer import RolloutBuffer
from polar.config.policy import ON_POLICY
from polar.trainers.env import EnvTrainer
from polar.trainers.loop import Metrics
from polar.types import Batch

log = logging.getLogger(__name__)


class OnPolicyTrainer(EnvTrainer):
    """PPO and APPO on any env harness. ``on_iteration(metrics)`` is called after every update (progress bars)."""

    ALGORITHMS: tuple[str, ...] = ON_POLICY

    def _fragment_steps(self) -> int:
        """Steps per env in one fragment (PPO's default splits ``rollout_samples`` across the envs)."""
        if self.cfg.policy.type == "ppo":
            return int(self.kw.steps_per_env(self.cfg.distribution.num_envs))
        return int(self.kw.n_steps)

    def _fragments_per_batch(self) -> int:
        # APPO learns from each fragment as it arrives; PPO waits for one fragment per worker (read each
        # time: the Ray backend resizes while running)
        return 1 if self.cfg.policy.type == "appo" else max(1, self.backend.num_workers)

    def _check_settings(self) -> None:
        rollout = self._fragment_steps() * self.cfg.distribution.num_envs
        if self.cfg.policy.type == "ppo" and (getattr(self.kw, "batch_size", None) or 0) > rollout:
            log.warning("policy.kwargs.batch_size %d is larger than one rollout (%d env steps: %d per env x %d envs): "
                        "every minibatch is the whole rollout. Lower batch_size, or raise n_steps or the env count.",
                        self.kw.batch_size, rollout, self._fragment_steps(), self.cfg.distribution.num_envs)

    def _make_learner(self) -> Any:
        if self.cfg.policy.type == "appo":
            return APPOLearner(self.train_agent, self.kw)
        return PPOLearner(self.train_agent, self.kw, self.cfg.total_env_steps)

    def update(self, batch: Batch) -> Metrics:
        frags = batch.data
        scale, clip = 1.0, None
        if self.reward_norm is not None:
            scale = 1.0 / math.sqrt(float(self.reward_norm.var) + 1e-8)
            clip = self.kw.clip_reward
        if self.cfg.policy.type == "appo":
            stats = self.learner.update_fragment(frags[0], self.version, scale, clip)
            if stats is None:
                # a dropped stale fragment changed no weight: publishing a new version would count a
                # non-update as policy lag for every fragment in flight and cascade into more drops
                return {"update_skipped": 1.0, "stale_dropped": float(self.learner.stale_dropped)}
            return {**stats, "update_skipped": 0.0}
        return self.learner.update(RolloutBuffer(frags), progress=min(1.0, self.env_steps / self.cfg.total_env_steps),
                                   reward_scale=scale, reward_clip=clip)  # the learner computes GAE
