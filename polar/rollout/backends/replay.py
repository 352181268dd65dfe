"""The replay collector of off-policy runs (DQN, SAC): each collect takes one fragment from the env collector,
adds its transitions to the replay buffer (through n-step windows when ``n_step_return`` > 1), and hands the
learner the buffer to sample its gradient steps from (``Batch[Replay]``).

One fragment is ``train_freq`` steps of every env, so a training phase follows every ``train_freq`` steps, as
in SB3. The replay buffer is collector state: it is saved next to each checkpoint (``save_replay_buffer``),
one file per kept checkpoint (``replay_<iteration>.npz``, a ``SideFile``), so a resumed run continues with the
data it had, not an empty buffer, also when it resumes from an older checkpoint. The disk cost is
``keep_checkpoints`` copies of the buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar.buffers.nstep import NStepTransitions
from polar.buffers.replay_buffer import ReplayBuffer
from polar.errors import CheckpointError
from polar.rollout.backends.base import RolloutBackend
from polar.rollout.backends.collector import EnvCollector
from polar.types import Batch, Fragment, Metrics, Replay, ReplaySampler, SideFile

log = logging.getLogger(__name__)


class ReplayCollector:
    """Fragments from ``env`` into ``replay``; batches name ``sampler`` (``replay`` itself, or a mix of an old
    dataset and it: ``replay_mix``). ``checkpoint_dir`` is where the replay files of checkpoints are read from."""

    def __init__(self, env: EnvCollector, replay: ReplayBuffer, nstep: NStepTransitions | None,
                 checkpoint_dir: Path, save_replay: bool, sampler: ReplaySampler | None = None) -> None:
        self.env = env
        self.replay = replay
        self.nstep = nstep
        self.checkpoint_dir = checkpoint_dir
        self.save_replay = save_replay
        self.sampler: ReplaySampler = sampler if sampler is not None else replay
        env.on_dropped = self._dropped

    def _dropped(self, frag: Fragment) -> None:
        if self.nstep is not None:  # its steps never reach the replay: later ones must not join the held ones
            self.nstep.forget(frag.worker_id)

    @property
    def backend(self) -> RolloutBackend:
        return self.env.backend

    def start(self, weights: Mapping[str, Any], version: int) -> None:
        self.env.start(weights, version)

    def collect(self) -> Batch[Replay]:
        batch = self.env.collect()
        added = 0
        for frag in batch.data.fragments:
            if self.nstep is None:
                self.replay.add_fragment(frag)
                added += frag.env_steps
            elif (transitions := self.nstep(frag)) is not None:
                self.replay.add(**transitions)
                added += len(transitions["rewards"])
        return Batch(data=Replay(self.sampler, added), env_steps=batch.env_steps,
                     episode_returns=batch.episode_returns, episode_lengths=batch.episode_lengths,
                     episode_successes=batch.episode_successes, policy_versions=batch.policy_versions)

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        self.env.publish(weights, version)

    def metrics(self) -> Metrics:
        out = {**self.env.metrics(), "replay_size": len(self.replay)}
        mixed_metrics = getattr(self.sampler, "metrics", None)
        if mixed_metrics is not None:  # replay_mix: the share drawn from the old dataset
            out.update(mixed_metrics())
        return out

    def close(self) -> None:
        self.env.close()

    def state_dict(self) -> dict[str, Any]:
        """The env collector's state and the replay buffer, as a file beside the checkpoint (or ``None`` when
        ``save_replay_buffer`` is off)."""
        replay_file = SideFile("replay", "npz", self.replay.save) if self.save_replay else None
        return {**self.env.state_dict(), "replay_file": replay_file}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.env.load_state_dict(state)
        name = state.get("replay_file")
        if not name:
            log.warning("this checkpoint has no replay buffer (save_replay_buffer was off): training resumes with an "
                        "empty buffer and waits for batch_size transitions")
            return
        path = self.checkpoint_dir / str(name)
        if not path.is_file():
            raise CheckpointError(f"checkpoint names replay buffer {path}, which is missing; restore the file, or "
                                  "resume from an earlier checkpoint")
        self.replay.load(path)
        log.info("replay buffer restored: %d transitions", len(self.replay))
