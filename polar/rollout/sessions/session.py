"""Session records: what one harness run turned into (status, reward, trajectory, why it failed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polar.types import SessionResult, SessionStatus, TrajectorySample

__all__ = ["SessionResult", "SessionSpec", "SessionStatus", "mask_out"]  # the records live in polar.types


@dataclass
class SessionSpec:
    """One session to run: a task, its GRPO group, and free metadata carried onto the trajectory."""

    session_id: str
    task: dict[str, Any]
    task_id: str = ""
    group_id: str | None = None
    sample_index: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)


def mask_out(samples: list[TrajectorySample]) -> list[TrajectorySample]:
    """Zero every loss mask (no training signal) but keep the tokens for inspection."""
    for s in samples:
        s.loss_mask = [0] * len(s.loss_mask)
    return samples
