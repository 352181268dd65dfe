"""The off-policy loop (DQN, SAC): collect a fragment -> add it to the replay buffer -> gradient steps on
replayed batches -> publish weights -> log -> checkpoint -> (eval).

It is the one loop (``polar.trainers.loop``) with a replay buffer between collection and the update: same
backends (envs in the learner, worker processes, or Ray actors), run directory, metrics, checkpoints
and ``polar resume`` as PPO. One fragment is ``train_freq`` steps of every env, so a training phase follows
every ``train_freq`` steps, as in SB3. An *iteration* groups training phases until at least
``iteration_env_steps`` transitions were collected, so logging, checkpoint and eval intervals
(counted in iterations) mean about the same as for PPO, whatever ``train_freq`` is.

The replay buffer is saved next to each checkpoint (``save_replay_buffer``), one file per kept
checkpoint, so a resumed run continues with the data it had, not an empty buffer, also when it
resumes from an older checkpoint. The disk cost is ``keep_checkpoints`` copies of the buffer.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from polar.algorithms.dqn import DQNLearner
from polar.algorithms.sac import SACLearner
from polar.buffers.nstep import NStepTransitions
from polar.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from polar.config.policy import OFF_POLICY
from polar.errors import CheckpointError
from polar.models.off_policy import QCritic, network_settings
from polar.trainers.continual import MixedReplay, old_replay
from polar.trainers.env import EnvTrainer
from polar.trainers.loop import Metrics
from polar.types import Batch, Fragment

log = logging.getLogger(__name__)

ITERATION_ENV_STEPS = 1000


def phase_gradient_steps(gradient_steps: int | None, train_freq: int, transitions: int) -> int:
    """Gradient steps after a fragment of ``transitions``: ``gradient_steps``, -1 = one per transition,
    None (the default) = one per ``train_freq`` transitions, so the updates per transition stay SB3's
    single-env ratio however many envs filled the fragment."""
    if gradient_steps is None:
        return max(1, transitions // train_freq)
    return transitions if gradient_steps < 0 else gradient_steps


class OffPolicyTrainer(EnvTrainer):
    """DQN / SAC on any env harness; the constructor is ``EnvTrainer``'s."""

    ALGORITHMS = OFF_POLICY
    iteration_env_steps = ITERATION_ENV_STEPS

    def _fragment_steps(self) -> int:
        return int(self.kw.train_freq)

    def _make_learner(self) -> Any:
        cfg, agent = self.cfg, self.train_agent
        space = self.backend.observation_space
        if cfg.policy.type == "dqn" and self.kw.prioritized_replay:
            self.replay = PrioritizedReplayBuffer(self.kw.buffer_size, space, self.backend.action_space, seed=cfg.seed,
                                                  alpha=self.kw.prioritized_replay_alpha,
                                                  eps=self.kw.prioritized_replay_eps)
        else:
            self.replay = ReplayBuffer(self.kw.buffer_size, space, self.backend.action_space, seed=cfg.seed)
        if cfg.policy.type == "dqn":
            learner = DQNLearner(agent, self.kw, cfg.total_env_steps)
        else:
            action_space, network = self.backend.action_space, network_settings(cfg)
            learner = SACLearner(agent, self.kw, lambda: QCritic(space, action_space, *network), action_space,
                                 cfg.total_env_steps)
        self.nstep = NStepTransitions(self.kw.n_steps, self.kw.gamma) if self.kw.n_steps > 1 else None
        # what gradient steps sample: the run's buffer, or with replay_mix a share from an old dataset too
        self.sampler: ReplayBuffer | MixedReplay = self.replay
        if cfg.replay_mix is not None:
            self.sampler = MixedReplay(old_replay(cfg, space, self.backend.action_space), self.replay,
                                       cfg.replay_mix.ratio)
        learner.set_exploration(0)
        return learner

    def update(self, batch: Batch) -> Metrics:
        """One training phase: the fragment into the replay buffer, then gradient steps on replayed batches
        (once ``learning_starts`` transitions arrived). The loop groups phases into iterations of
        ``ITERATION_ENV_STEPS`` transitions."""
        kw = self.kw
        stats: Metrics = {}
        for frag in batch.data:
            if self.nstep is None:
                self.replay.add_fragment(frag)
            elif (transitions := self.nstep(frag)) is not None:
                self.replay.add(**transitions)
            # a resumed run whose checkpoint had no buffer waits until a batch's worth arrived again
            if self.env_steps > kw.learning_starts and len(self.replay) >= min(kw.batch_size, max(1, kw.learning_starts)):
                steps = phase_gradient_steps(kw.gradient_steps, kw.train_freq, frag.env_steps)
                stats.update(self.learner.train(self.sampler, steps, self.env_steps) or {})
        self.learner.set_exploration(self.env_steps)
        stats["replay_size"] = len(self.replay)
        if isinstance(self.sampler, MixedReplay):
            stats.update(self.sampler.metrics())
        if self.cfg.policy.type == "dqn":  # also during the warm-up, before the first training phase
            agent = self.train_agent
            stats["exploration_rate"] = float(agent.explore_uniform.clamp(min=agent.epsilon))
        return stats

    def _dropped(self, frag: Fragment) -> None:
        if self.nstep is not None:  # its steps never reach the replay: later ones must not join the held ones
            self.nstep.forget(frag.worker_id)

    # ------------------------------------------------------------------ checkpoints
    def _replay_path(self, iteration: int) -> Path:
        return self.checkpoints.dir / f"replay_{iteration:08d}.npz"

    def _save_checkpoint(self) -> None:
        """The replay buffer first, then the checkpoint that names it. Every kept checkpoint keeps its own
        replay file (a resume that falls back to an older checkpoint needs *its* buffer); a replay file goes
        when its checkpoint is pruned (``logging.keep_checkpoints``)."""
        replay_file = None
        if self.kw.save_replay_buffer:
            path = self._replay_path(self.iteration)
            self.replay.save(path)
            replay_file = path.name
        state = self._state()
        state["replay_file"] = replay_file
        self.checkpoints.save(self.iteration, state)
        kept = {self._replay_path(int(p.stem.removeprefix("ckpt_"))).name for p in self.checkpoints.all()}
        for old in self.checkpoints.dir.glob("replay_*.npz"):
            if old.name not in kept:
                old.unlink(missing_ok=True)

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        name = state.get("replay_file")
        if not name:
            log.warning("this checkpoint has no replay buffer (save_replay_buffer was off): training resumes with an "
                        "empty buffer and waits for batch_size transitions")
            return
        path = self.checkpoints.dir / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint names replay buffer {path}, which is missing; restore the file, or "
                                  "resume from an earlier checkpoint")
        self.replay.load(path)
        self.learner.set_exploration(self.env_steps)
        log.info("replay buffer restored: %d transitions", len(self.replay))
