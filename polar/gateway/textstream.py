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

import threading
from collections import OrderedDict
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
        # a character spans at most 4 bytes: past that many pending ids the bytes are invalid UTF-8, shown as
        # U+FFFD, so a model emitting invalid bytes cannot make each step decode an ever longer window
        if len(new_text) > len(prefix_text) and (not new_text.endswith("\ufffd") or len(self.ids) - self._read > 8):
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


class StopMatcher:
    """An Aho-Corasick automaton over the watched strings (stop strings, the tool-call tag).

    Fed one character at a time it finds every occurrence in time linear in the text, whatever the
    number of strings, and its state's depth is the longest suffix of the text so far that is a prefix
    of some string: the text that must be held back. Immutable once built, so one automaton serves
    every call with the same strings (``matcher_for`` caches them)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        out: list[list[int]] = [[]]
        for k, p in enumerate(self.patterns):
            node = 0
            for ch in p:
                nxt = goto[node].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][ch] = nxt
                    goto.append({})
                    depth.append(depth[node] + 1)
                    out.append([])
                node = nxt
            out[node].append(k)
        fail = [0] * len(goto)
        queue = list(goto[0].values())
        for node in queue:  # breadth first: a node's failure link is set before its children's
            for ch, child in goto[node].items():
                f = fail[node]
                while f and ch not in goto[f]:
                    f = fail[f]
                target = goto[f].get(ch, 0)
                fail[child] = target if target != child else 0
                out[child] = out[child] + out[fail[child]]
                queue.append(child)
        self._goto, self._fail, self.depth, self._out = goto, fail, depth, out

    def step(self, node: int, ch: str) -> int:
        goto, fail = self._goto, self._fail
        while node and ch not in goto[node]:
            node = fail[node]
        return goto[node].get(ch, 0)

    def ending_at(self, node: int) -> list[int]:
        """Indices of the patterns that end at this state."""
        return self._out[node]


_MATCHERS: OrderedDict[tuple[str, ...], StopMatcher] = OrderedDict()
_MAX_MATCHERS = 256
_MATCHERS_LOCK = threading.Lock()


def matcher_for(patterns: Sequence[str]) -> StopMatcher:
    """The (cached) automaton for ``patterns``: harnesses send the same stop strings on every call."""
    key = tuple(patterns)
    with _MATCHERS_LOCK:  # streams are set up on worker threads
        m = _MATCHERS.get(key)
        if m is not None:
            _MATCHERS.move_to_end(key)
            return m
    m = StopMatcher(key)
    with _MATCHERS_LOCK:
        _MATCHERS[key] = m
        while len(_MATCHERS) > _MAX_MATCHERS:
            _MATCHERS.popitem(last=False)
    return m


class TextStream:
    """Accumulates decoded text and says which part is safe to show; see the module docstring.

    Each ``feed`` costs time linear in its delta (plus the matches found), never in the whole text or
    the number of stop strings: a request cannot make per-token work grow with what it sends."""

    def __init__(self, stop: Sequence[str] = (), parse_tools: bool = False) -> None:
        self.stop = list(dict.fromkeys(s for s in stop if s))
        self.parse_tools = parse_tools
        self._n_stop = len(self.stop)
        self._matcher = matcher_for([*self.stop, *([TOOL_CALL_START] if parse_tools else [])])
        self._node = 0
        self.text = ""
        self.shown = 0  # chars of ``text`` already emitted
        self._shown_text = False  # has anything but whitespace been emitted yet
        self.stop_hit: str | None = None
        self.in_tool_call = False
        self._tool_at = -1  # where the first tool-call tag starts in ``text``

    def feed(self, delta: str) -> str:
        """Add decoded text; return the part that can be emitted now. Sets ``stop_hit`` on a stop string."""
        if self.stop_hit is not None or not delta:
            return ""
        base = len(self.text)
        self.text += delta
        m, node, n_stop = self._matcher, self._node, self._n_stop
        best: tuple[int, str] | None = None  # the earliest-starting stop string that ends in this delta
        for offset, ch in enumerate(delta if m.patterns else ()):  # nothing watched: no step per character
            node = m.step(node, ch)
            for k in m.ending_at(node):
                start = base + offset + 1 - len(m.patterns[k])
                if k < n_stop:
                    if best is None or (start, m.patterns[k]) < best:
                        best = (start, m.patterns[k])
                elif self._tool_at < 0:
                    self._tool_at = start
        self._node = node
        if best is not None:
            i, s = best
            self.text = self.text[:i]
            self.stop_hit = s
            if self._tool_at >= 0 and self._tool_at + len(TOOL_CALL_START) > i:
                self._tool_at = -1  # the tag was cut with the stop string
                self.in_tool_call = False
        if self._tool_at >= 0:
            self.in_tool_call = True
            limit = self._tool_at
        elif self.stop_hit is not None:
            limit = len(self.text)
        else:
            limit = len(self.text) - m.depth[node]
        return self._emit(limit, final=False)

    def finish(self) -> str:
        """End of generation: release held-back text (not text after a tool-call tag)."""
        limit = self._tool_at if self.in_tool_call else len(self.text)
        return self._emit(limit, final=not self.in_tool_call)

    def _emit(self, limit: int, final: bool) -> str:
        chunk = self.text[self.shown : limit]
        if not final:
            chunk = chunk.rstrip()  # hold trailing whitespace until something follows it
            if not self._shown_text and not chunk.strip():
                return ""
        self.shown += len(chunk)
        self._shown_text = self._shown_text or bool(chunk.strip())
        return chunk
