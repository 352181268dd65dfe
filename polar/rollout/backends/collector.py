"""The env collector: fragments from a rollout backend (local processes or Ray actors), checked for non-finite
values, with the normalizer moments folded in, as one ``Batch[Rollout]`` per collect.

Non-finite values (NaN, inf) in what the learner trains on are found once per fragment, named, then failed or
skipped. A NaN in one observation or reward spreads through the next update into every weight, and the run
goes on with ``null`` losses. ``nonfinite: fail`` (the default) stops at the first fragment holding one and
names its source (the harness, the rollout worker, the env copy, the step, the field); ``nonfinite: skip``
drops such fragments and counts them (``nonfinite_skipped_fragments``). The check is one
``np.isfinite(...).all()`` per float array of a fragment; locating the bad value runs only when there is one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from polar.buffers.rollout_buffer import RolloutBuffer
from polar.config.run import AnyHarnessConfig
from polar.errors import NonFiniteError
from polar.models.normalization import RunningNorm
from polar.models.policy import Policy
from polar.rollout.backends.base import RolloutBackend
from polar.types import Batch, Fragment, Metrics, Rollout

log = logging.getLogger(__name__)

# skipping more fragments than this in a row means the harness only produces non-finite values
MAX_CONSECUTIVE_SKIPS = 100


def harness_name(harness_cfg: AnyHarnessConfig) -> str:
    """How errors name the harness: the connector class (or its command), or the Gymnasium id."""
    spec = getattr(harness_cfg, "connector_spec", None)
    if spec is not None:
        return f"connector {spec.class_name or ' '.join(spec.command or [])}"
    return f"env {getattr(harness_cfg, 'id', harness_cfg.type)}"


def _arrays(frag: Fragment) -> list[tuple[str, np.ndarray]]:
    out = [("rewards", frag.rewards)]
    for name, value in (("observations", frag.obs), ("next observations", frag.next_obs)):
        if isinstance(value, dict):
            out.extend((f"{name} {key!r}", v) for key, v in value.items())
        elif value is not None:
            out.append((name, value))
    return out


def find_nonfinite(frag: Fragment, source: str) -> str | None:
    """None when every float array of ``frag`` is finite, else a sentence naming the first non-finite value."""
    for name, arr in _arrays(frag):
        arr = np.asarray(arr)
        if arr.dtype.kind not in "fc" or np.isfinite(arr).all():
            continue
        bad = np.argwhere(~np.isfinite(arr))[0]  # [t, copy, ...]
        step, copy = int(bad[0]), int(bad[1]) if arr.ndim > 1 else 0
        value = arr[tuple(bad)]
        return (f"{source}, rollout worker {frag.worker_id}, env copy {copy}: {name} hold {value} at fragment "
                f"step {step}")
    return None


class FiniteGuard:
    """Applies ``nonfinite: fail | skip`` to each fragment the learner receives."""

    def __init__(self, mode: str, source: str) -> None:
        self.mode = mode
        self.source = source
        self.skipped = 0
        self._in_a_row = 0

    def accept(self, frag: Fragment) -> bool:
        """True to train on ``frag``; False to drop it (skip mode); raises ``NonFiniteError`` in fail mode."""
        problem = find_nonfinite(frag, self.source)
        if problem is None:
            self._in_a_row = 0
            return True
        if self.mode != "skip":
            raise NonFiniteError(f"non-finite value from {problem}. Fix the environment, or set `nonfinite: skip` to "
                                 "drop such fragments and count them")
        self.skipped += 1
        self._in_a_row += 1
        if self._in_a_row > MAX_CONSECUTIVE_SKIPS:
            raise NonFiniteError(f"nonfinite: skip dropped {self._in_a_row} fragments in a row; the last came from "
                                 f"{problem}. The environment produces nothing finite to train on")
        return False


class EnvCollector:
    """The Collector of env runs: ``fragments()`` fragments per batch from a rollout backend (local processes,
    or Ray actors; read each time: the Ray backend resizes while running), each with finite observations and
    rewards (``nonfinite: fail`` raises on the first other one, naming its source; ``skip`` drops it, counts it
    and tells ``on_dropped``).

    It folds each fragment's normalizer moments in: the observation normalizer's (part of the acting policy),
    and the return normalizer's (``reward_norm``, its own state, saved as ``reward_norm``), whose scale rides on
    the batch (``Rollout.reward_scale``/``reward_clip``). ``buffered``: also stack the fragments into one
    ``RolloutBuffer`` (``Rollout.buffer``, PPO's epochs run on it)."""

    def __init__(self, backend: RolloutBackend, policy: Policy, finite: FiniteGuard, fragments: Callable[[], int],
                 reward_norm: RunningNorm | None = None, reward_clip: float | None = None, buffered: bool = False,
                 on_dropped: Callable[[Fragment], None] | None = None) -> None:
        self.backend = backend
        self.policy = policy
        self.finite = finite
        self.fragments = fragments
        self.reward_norm = reward_norm
        self.reward_clip = reward_clip
        self.buffered = buffered
        self.on_dropped = on_dropped
        self.connector_process_restarts = 0
        self.connector_copies_restarted = 0
        self.collect_s_max = 0.0  # the slowest fragment since the last metrics row

    @property
    def num_workers(self) -> int:
        return int(self.backend.num_workers)

    def start(self, weights: Mapping[str, Any], version: int) -> None:
        self.backend.start(dict(weights), version, policy=self.policy)

    def next_fragment(self) -> Fragment:
        while True:
            frag = self.backend.next_fragment()
            if self.finite.accept(frag):
                self.connector_process_restarts += frag.connector_process_restarts
                self.connector_copies_restarted += frag.connector_copies_restarted
                self.collect_s_max = max(self.collect_s_max, frag.collect_s)
                log.debug("fragment %s from worker %d (collected in %.3fs) received", frag.trace_id, frag.worker_id,
                          frag.collect_s, extra={"trace_id": frag.trace_id})  # the worker's line has the same id
                return frag
            if self.on_dropped is not None:
                self.on_dropped(frag)

    def _absorb(self, frag: Fragment) -> None:
        """Fold a fragment's normalizer moments in."""
        if self.policy.obs_norm is not None and frag.obs_moments is not None:
            self.policy.obs_norm.update_from_moments(frag.obs_moments)
        if self.reward_norm is not None and frag.return_moments is not None:
            self.reward_norm.update(*frag.return_moments)

    def collect(self) -> Batch[Rollout]:
        frags = [self.next_fragment() for _ in range(self.fragments())]
        for f in frags:
            self._absorb(f)
        scale, clip = 1.0, None
        if self.reward_norm is not None:
            scale = 1.0 / math.sqrt(float(self.reward_norm.var) + 1e-8)
            clip = self.reward_clip
        rollout = Rollout(frags, scale, clip, RolloutBuffer(frags) if self.buffered else None)
        return Batch(data=rollout, env_steps=sum(f.env_steps for f in frags),
                     episode_returns=[r for f in frags for r in f.episode_returns],
                     episode_lengths=[n for f in frags for n in f.episode_lengths],
                     episode_successes=[s for f in frags for s in f.episode_successes],
                     policy_versions=[f.policy_version for f in frags])

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        self.backend.publish_weights(dict(weights), version)

    def metrics(self) -> Metrics:
        out: Metrics = {"nonfinite_skipped_fragments": self.finite.skipped,
                        "connector/process_restarts": self.connector_process_restarts,
                        "connector/copies_restarted": self.connector_copies_restarted,
                        # the slowest fragment since the last row: one slow connector copy or worker shows here
                        "rollout/fragment_collect_s_max": self.collect_s_max}
        self.collect_s_max = 0.0
        backend_metrics = getattr(self.backend, "metrics", None)
        if backend_metrics is not None:  # optional hook (ray: per-role throughput, queue depth, lag, restarts)
            out.update(backend_metrics())
        return out

    def close(self) -> None:
        self.backend.close()

    def state_dict(self) -> dict[str, Any]:
        return {"reward_norm": self.reward_norm.state_dict() if self.reward_norm is not None else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.reward_norm is not None and state.get("reward_norm") is not None:
            self.reward_norm.load_state_dict(state["reward_norm"])
