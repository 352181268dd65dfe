"""Plain typed records shared across layers: the same schema in memory, on disk and on the wire.

Env-side rollouts use numpy batches defined next to their buffers; this module holds the records
that cross the gateway/trainer boundary, where a stable schema matters most.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CallRecord:
    """One model call made by an agent harness through the gateway, exactly as the engine saw it.

    ``prompt_ids`` are the ids the engine consumed; ``sampled_ids``/``logprobs`` are what it produced.
    ``complete`` is False when token data is missing (an upstream that did not return ids, an error,
    a cancelled stream); such calls are never trained on.
    """

    session_id: str
    call_index: int
    provider: str  # openai_chat | openai_responses | anthropic | gemini
    model: str  # the name the client asked for
    messages: list[dict[str, Any]]  # normalized (OpenAI-chat-like) messages incl. tools
    prompt_ids: list[int]
    sampled_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    started_at: float
    ended_at: float
    error: str | None = None
    complete: bool = True
    tools: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CallRecord:
        return cls(**d)


@dataclass
class TrajectorySample:
    """One training sequence built from a session's calls.

    ``loss_mask[i] == 1`` only where ``token_ids[i]`` was sampled by the policy; prompt, tool-result and
    template tokens are 0. ``logprobs[i]`` is the behaviour policy's logprob where the mask is 1, else 0.
    """

    session_id: str
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    call_indices: list[int]
    reward: float | None = None
    group_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
