"""Per-session KV prefix cache for the embedded engine.

Agent sessions resend their whole history every turn, and the gateway keeps earlier turns' token ids
exact, so a turn's prompt usually extends the previous turn's prompt + sampled ids. Keeping that KV
(one entry per session, least recently used evicted past a token budget) turns each turn's prefill
into a prefill of only the new tail. Entries belong to one set of weights: the engine clears the
cache whenever weights change.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch


@dataclass
class PrefixEntry:
    tokens: list[int]  # the ids whose keys/values are in ``kv``
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, (1, heads, len(tokens), head_dim)


class PrefixCache:
    """``session_id`` → the KV of that session's last finished sequence, within ``max_tokens`` in total."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: collections.OrderedDict[str, PrefixEntry] = collections.OrderedDict()
        self._tokens = 0
        self.hits = 0
        self.tokens_reused = 0

    def put(self, session_id: str, entry: PrefixEntry) -> None:
        if self.max_tokens <= 0 or len(entry.tokens) > self.max_tokens:
            return
        self._pop(session_id)
        self._entries[session_id] = entry
        self._tokens += len(entry.tokens)
        while self._tokens > self.max_tokens:
            self._pop(next(iter(self._entries)))

    def take(self, session_id: str | None, prompt_ids: list[int]) -> PrefixEntry | None:
        """Remove and return the session's entry if it is a strict prefix of ``prompt_ids``."""
        if session_id is None or session_id not in self._entries:
            return None
        entry = self._pop(session_id)
        n = len(entry.tokens)
        if n < len(prompt_ids) and prompt_ids[:n] == entry.tokens:
            self.hits += 1
            self.tokens_reused += n
            return entry
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _pop(self, session_id: str) -> PrefixEntry:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self._tokens -= len(entry.tokens)
        return entry  # type: ignore[return-value]
