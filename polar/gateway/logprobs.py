"""Token ids as clients see them in logprobs: the UTF-8 bytes each token stands for, and its text.

OpenAI's ``logprobs.content[].token`` is the token's text and ``bytes`` its UTF-8 bytes (a token may
hold part of a character: then the text has U+FFFD and the bytes say exactly what it held). A tokenizer's
own piece strings are not that: byte-level BPE spells bytes as printable stand-ins (``"\u0120fix"`` for
``" fix"``), SentencePiece writes spaces as ``"\u2581"`` and single bytes as ``"<0xE6>"``. This module
undoes those spellings; the answer per id is cached, since a vocabulary never changes under a server.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted (what byte-level BPE pieces are spelled in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenBytes:
    """``bytes_of(id)`` for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        spelled = " ".join(repr(getattr(backend, part, None)) for part in ("decoder", "pre_tokenizer"))
        self.byte_level = "ByteLevel" in spelled
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self._cache: dict[int, bytes] = {}

    def bytes_of(self, token_id: int) -> bytes:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._bytes(token_id)
        return cached

    def _bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
        if piece is None:
            return b""
        if self.byte_level and token_id not in self.special:
            table = _byte_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        match = _BYTE_PIECE.match(piece)
        if match and token_id not in self.special:
            return bytes([int(match.group(1), 16)])
        if token_id in self.special:
            return piece.encode("utf-8")
        return piece.replace("\u2581", " ").encode("utf-8")

    def entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        """One OpenAI-shaped ``{"token", "logprob", "bytes"}``."""
        raw = self.bytes_of(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}
