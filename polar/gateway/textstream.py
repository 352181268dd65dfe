"""Token ids -> text deltas while the engine generates: partial UTF-8, stop strings, tool-call holdback.

``IncrementalDetokenizer`` is the usual prefix/read-offset scheme: a token that ends inside a
multi-byte character yields nothing until the character completes, so clients never see U+FFFD.

``TextStream`` sits on top and decides what may be shown *now*:

- text that could still turn into a stop string is held back until it cannot;
- once ``<tool_call>`` appears (when tools are enabled) nothing more is shown as text: the calls are
  parsed at the end and sent in the provider's tool-call shape;
- trailing whitespace is held back, so the text shown while streaming equals the final content
  (which drops whitespace before a tool call).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar.gateway.toolcalls import TOOL_CALL_START


class IncrementalDetokenizer:
    """Decode a growing list of ids into text deltas, never splitting a UTF-8 character."""

    def __init__(self, tokenizer: Any, skip_ids: Sequence[int] = ()) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        if backend is not None:
            self._decode = lambda ids: backend.decode(ids, skip_special_tokens=False)
        else:  # slow tokenizer fallback
            self._decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        self.skip = frozenset(int(i) for i in skip_ids)
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        """Add one sampled id; return the newly complete text (maybe empty)."""
        if token_id in self.skip:  # end-of-turn ids are not text
            return ""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        new_text = self._decode(self.ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is left at the end, even an incomplete character."""
        if self._prefix == self._read:  # nothing shown yet from here on (e.g. a non-streamed call): one decode
            text = self._decode(self.ids[self._prefix :])
            self._prefix = self._read = len(self.ids)
            return text
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        new_text = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return new_text[len(prefix_text) :]


def _partial_suffix(text: str, patterns: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some pattern."""
    best = 0
    for p in patterns:
        for n in range(min(len(p) - 1, len(text)), best, -1):
            if text.endswith(p[:n]):
                best = n
                break
    return best


class TextStream:
    """Accumulates decoded text and says which part is safe to show; see the module docstring."""

    def __init__(self, stop: Sequence[str] = (), parse_tools: bool = False) -> None:
        self.stop = [s for s in stop if s]
        self.parse_tools = parse_tools
        self._watch = [*self.stop, *([TOOL_CALL_START] if parse_tools else [])]
        self.text = ""
        self.shown = 0  # chars of ``text`` already emitted
        self.stop_hit: str | None = None
        self.in_tool_call = False

    def feed(self, delta: str) -> str:
        """Add decoded text; return the part that can be emitted now. Sets ``stop_hit`` on a stop string."""
        if self.stop_hit is not None or not delta:
            return ""
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text += delta
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if hits:
            i, s = min(hits)
            self.text = self.text[:i]
            self.stop_hit = s
        if self.parse_tools and not self.in_tool_call and TOOL_CALL_START in self.text:
            self.in_tool_call = True
        if self.in_tool_call:
            limit = self.text.find(TOOL_CALL_START)
        elif self.stop_hit is not None:
            limit = len(self.text)
        else:
            limit = len(self.text) - _partial_suffix(self.text, self._watch)
        return self._emit(limit, final=False)

    def finish(self) -> str:
        """End of generation: release held-back text (not text after a tool-call tag)."""
        limit = self.text.find(TOOL_CALL_START) if self.in_tool_call else len(self.text)
        return self._emit(limit, final=not self.in_tool_call)

    def _emit(self, limit: int, final: bool) -> str:
        chunk = self.text[self.shown : limit]
        if not final:
            chunk = chunk.rstrip()  # hold trailing whitespace until something follows it
            if not self.text[: self.shown].strip() and not chunk.strip():
                return ""
        self.shown += len(chunk)
        return chunk
