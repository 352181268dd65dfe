"""Session records: what one harness run turned into (status, reward, trajectory, why it failed)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from polar.types import TrajectorySample


class SessionStatus(str, enum.Enum):
    PENDING = "pending"
    INIT = "init"
    RUN = "run"
    POST_RUN = "post_run"
    DONE = "done"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (SessionStatus.DONE, SessionStatus.ERROR, SessionStatus.TIMEOUT, SessionStatus.CANCELLED)


@dataclass
class SessionSpec:
    """One session to run: a task, its GRPO group, and free metadata carried onto the trajectory."""

    session_id: str
    task: dict[str, Any]
    task_id: str = ""
    group_id: str | None = None
    sample_index: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class SessionResult:
    """The outcome of a session. ``samples`` carry the reward; a sample is trainable only if its mask has 1s.

    - DONE: verified; samples trainable unless a call lacked token data (then fully masked).
    - TIMEOUT: reward 0; trainable when every call's token data is complete, fully masked otherwise.
    - ERROR / CANCELLED: no training signal (masks zeroed, reward None); ``error`` says why.

    ``node_id`` is the gateway node that finally served the session. When a node died under it, the
    session was re-dispatched from INIT on another node: ``attempts`` counts the starts and
    ``lost_nodes`` lists ``{node_id, reason}`` for each node it lost.
    """

    session_id: str
    task_id: str
    group_id: str | None
    sample_index: int
    status: SessionStatus
    error: str | None = None
    reward: float | None = None
    verifier_output: dict[str, Any] = field(default_factory=dict)
    output: str = ""
    num_calls: int = 0
    node_id: str | None = None
    attempts: int = 1
    lost_nodes: list[dict[str, str]] = field(default_factory=list)
    samples: list[TrajectorySample] = field(default_factory=list)
    builder_stats: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def redispatched(self) -> int:
        """How many times the session was restarted on another node because its node was lost."""
        return self.attempts - 1

    @property
    def trainable(self) -> bool:
        return any(any(s.loss_mask) for s in self.samples)

    def to_dict(self, with_samples: bool = True) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        if not with_samples:
            d.pop("samples")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionResult:
        d = dict(d)
        d["status"] = SessionStatus(d["status"])
        d["samples"] = [TrajectorySample(**s) for s in d.get("samples", [])]
        return cls(**d)


def mask_out(samples: list[TrajectorySample]) -> list[TrajectorySample]:
    """Zero every loss mask (no training signal) but keep the tokens for inspection."""
    for s in samples:
        s.loss_mask = [0] * len(s.loss_mask)
    return samples
