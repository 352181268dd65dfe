"""Tokenization by segment, with a cache: the same ids as encoding the whole prompt, computed once per segment.

A Hugging Face tokenizer cuts its input at added tokens (``<|im_start|>``, ``<|im_end|>``, ...) before
it normalizes or pre-tokenizes anything, and encodes the text between them independently. So a rendered
chat prompt encodes to the concatenation of its segments' encodings, and a harness that resends the
same system prompt and history on every call (they all do) only pays for its new segments. For a coding
CLI with a 10k-token system prompt that is most of the tokenizer's work per call.

The split is used only where it is exact: no normalizer that could change the text around an added
token, no added token that strips neighbouring whitespace or must stand alone as a word, and a probe
check at start-up against whole-text encoding. Otherwise ``build`` returns ``None`` and the caller
encodes whole prompts.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

_PROBES = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n  Hi  there\n\n<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b <|im_start|> c\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>  end ",
    "<|endoftext|><|endoftext|>x  <|im_end|>\t\ny\u00e9\u4e2d ",
)


class TooManyTokens(Exception):
    """An encoding went over its token limit; ``count`` is how many tokens it had at that point (a floor
    of the whole text's count). Raised before the ids become a Python list, the costly part."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} tokens")
        self.count = count


class WouldBlock(Exception):
    """Encoding this text inline would hold the event loop: more than the inline budget of characters is
    not cached. Raised before anything is encoded; the caller moves the work to a worker thread."""


Encode = Callable[..., list[int]]  # encode(text, limit=None): ids, or TooManyTokens past ``limit``


class SegmentEncoder:
    """``encode(text)`` = whole-text encoding, from cached per-segment encodings.

    Thread-safe: prompts are tokenized on worker threads, so the cache is only touched under a lock
    (the encoding itself runs outside it)."""

    def __init__(self, encode: Encode, added: dict[str, int], max_chars: int = 8_000_000) -> None:
        self._encode = encode
        self._added = added
        names = sorted(added, key=len, reverse=True)  # longest first, as the tokenizer matches them
        self._split = re.compile("(" + "|".join(re.escape(n) for n in names) + ")").split
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self.max_chars = max_chars  # the cache's size bound: total characters of the cached segments
        self._chars = 0
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    @classmethod
    def build(cls, tokenizer: Any, encode: Encode, **kwargs: Any) -> SegmentEncoder | None:
        """A segment encoder for ``tokenizer``, or ``None`` where segment-wise encoding might differ."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        added = getattr(tokenizer, "added_tokens_decoder", None)
        if backend is None or not added or backend.normalizer is not None:
            return None
        if any(t.lstrip or t.rstrip or t.single_word for t in added.values()):
            return None
        enc = cls(encode, {t.content: int(i) for i, t in added.items()}, **kwargs)
        names = list(enc._added)
        probes = [*_PROBES, "".join(f"{n}x {n} " for n in names)]
        for probe in probes:
            if enc.encode(probe) != list(encode(probe)):
                log.info("segment-wise tokenization differs from whole-text tokenization; not caching segments")
                return None
        enc._cache.clear()
        enc._chars = enc.hits = enc.misses = 0
        return enc

    def _encode_within(self, text: str, limit: int | None) -> list[int]:
        if limit is None:
            return self._encode(text)
        return self._encode(text, limit)

    def uncached_chars(self, parts: list[str]) -> int:
        """How many characters of ``parts`` (a split text) would have to be encoded: the cache misses."""
        with self._lock:
            return sum(len(p) for p in parts[::2] if p not in self._cache)

    def encode(self, text: str, limit: int | None = None, inline_chars: int | None = None) -> list[int]:
        """The whole text's ids; past ``limit`` tokens, ``TooManyTokens`` (no further segment is encoded).
        With ``inline_chars``: ``WouldBlock`` first when more characters than that are not cached."""
        parts = self._split(text)
        segments = parts[::2]  # the split's odd parts are the added tokens themselves
        with self._lock:  # one look-up pass under one lock: most segments of a prompt were seen before
            get, cache = self._cache.get, self._cache
            found = [get(p) for p in segments]
            for p, ids_of in zip(segments, found, strict=True):
                if ids_of is not None:
                    cache.move_to_end(p)
            self.hits += len(found) - found.count(None)
        if inline_chars is not None and sum(
                len(p) for p, ids_of in zip(segments, found, strict=True) if ids_of is None) > inline_chars:
            raise WouldBlock
        added = self._added
        ids: list[int] = []
        for i, part in enumerate(segments):
            if i:
                ids.append(added[parts[2 * i - 1]])
                if limit is not None and len(ids) > limit:
                    raise TooManyTokens(len(ids))
            seg: Sequence[int] | None = found[i]
            if seg is None and part:
                try:
                    seg = self._segment(part, None if limit is None else limit - len(ids))
                except TooManyTokens as e:
                    raise TooManyTokens(len(ids) + e.count) from None
            if seg:
                if limit is not None and len(ids) + len(seg) > limit:
                    raise TooManyTokens(len(ids) + len(seg))
                ids.extend(seg)
        return ids

    def _segment(self, text: str, limit: int | None) -> tuple[int, ...] | list[int]:
        if len(text) > self.max_chars // 4:
            return self._encode_within(text, limit)
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None:
                self.hits += 1
                self._cache.move_to_end(text)
        if cached is not None:
            if limit is not None and len(cached) > limit:
                raise TooManyTokens(len(cached))
            return cached
        ids = tuple(self._encode_within(text, limit))
        with self._lock:
            self.misses += 1
            if text not in self._cache:
                self._cache[text] = ids
                self._chars += len(text)
            while self._chars > self.max_chars:
                old, _ = self._cache.popitem(last=False)
                self._chars -= len(old)
        return ids
