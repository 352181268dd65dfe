"""Non-finite values (NaN, inf) in what the learner trains on: found once per fragment, named, then failed or skipped.

A NaN in one observation or reward spreads through the next update into every weight, and the run
goes on with ``null`` losses. ``nonfinite: fail`` (the default) stops at the first fragment holding
one and names its source (the harness, the rollout worker, the env copy, the step, the field);
``nonfinite: skip`` drops such fragments and counts them (``nonfinite_skipped_fragments``). A
non-finite loss always fails: it comes from finite data, so the update itself diverged, and its
weights are not checkpointed.

The check is one ``np.isfinite(...).all()`` per float array of a fragment; locating the bad value
runs only when there is one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from polar.errors import NonFiniteError

# skipping more fragments than this in a row means the harness only produces non-finite values
MAX_CONSECUTIVE_SKIPS = 100


def harness_name(harness_cfg: Any) -> str:
    """How errors name the harness: the connector class (or its command), or the Gymnasium id."""
    spec = getattr(harness_cfg, "connector_spec", None)
    if spec is not None:
        return f"connector {spec.class_name or ' '.join(spec.command or [])}"
    return f"env {getattr(harness_cfg, 'id', harness_cfg.type)}"


def _arrays(frag) -> list[tuple[str, np.ndarray]]:
    out = [("rewards", frag.rewards)]
    for name, value in (("observations", frag.obs), ("next observations", frag.next_obs)):
        if isinstance(value, dict):
            out.extend((f"{name} {key!r}", v) for key, v in value.items())
        elif value is not None:
            out.append((name, value))
    return out


def find_nonfinite(frag, source: str) -> str | None:
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


def check_losses(stats: dict[str, Any], iteration: int, env_steps: int) -> None:
    """Raise ``NonFiniteError`` naming the first non-finite loss term in an update's stats."""
    for key, value in stats.items():
        if key != "loss" and not key.endswith("_loss"):
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(v):
            raise NonFiniteError(
                f"loss term {key} is {v} at iteration {iteration} ({env_steps} env steps) although observations "
                "and rewards were finite: the update diverged. Lower policy.kwargs.learning_rate or clip gradients "
                "(max_grad_norm), then `polar resume` from the last checkpoint (written before this update)"
            )


class FiniteGuard:
    """Applies ``nonfinite: fail | skip`` to each fragment the learner receives."""

    def __init__(self, mode: str, source: str) -> None:
        self.mode = mode
        self.source = source
        self.skipped = 0
        self._in_a_row = 0

    def accept(self, frag) -> bool:
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
