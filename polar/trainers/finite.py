"""A non-finite loss (NaN, inf) fails the run before its weights are checkpointed.

Non-finite *data* is caught earlier, per fragment, by the env collector's guard
(``polar.rollout.backends.collector.FiniteGuard``): a non-finite loss therefore comes from finite data, so the
update itself diverged.
"""

from __future__ import annotations

import math
from typing import Any

from polar.errors import NonFiniteError


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
