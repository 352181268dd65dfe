"""Chat template rendering and tokenization, with exact reuse of earlier sampled ids.

The gateway owns tokenization. For a new request it renders the chat template and tokenizes it, but
where the conversation continues an earlier call of the *same session* (same tools, same messages up
to an assistant turn, and that assistant turn is what the call produced) it does not re-tokenize the
assistant text: the prompt becomes ``earlier prompt ids + earlier sampled ids + tokens of the rest``.
Re-tokenizing would drift (``[fish, ing]`` vs ``[fishing]``; tool-call JSON re-serialized), and then
the trajectory would no longer be what the policy sampled.

The rest is found by rendering the conversation up to and including that assistant turn: if the full
rendering starts with it, the tail after the turn's end-of-turn marker is tokenized and appended. If
the template rewrites history (e.g. drops old reasoning), the prefix test fails and the prompt is
re-tokenized whole; the record says so (``metadata.prompt_reuse``) and trajectory builders then start
a new chain there.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from polar.gateway.normalized import Message, canonical_json
from polar.gateway.tokencache import SegmentEncoder, TooManyTokens, WouldBlock
from polar.inference.base import ContextLengthExceeded


def message_key(m: Message) -> bytes:
    """What identifies a message for reuse matching: role, stripped text, tool calls (ids ignored)."""
    d: dict[str, Any] = {"r": m.get("role"), "c": (m.get("content") or "").strip()}
    calls = m.get("tool_calls")
    if calls:
        d["t"] = [[c["function"]["name"], c["function"]["arguments"]] for c in calls]
    return canonical_json(d)


def prefix_hashes(tools: Sequence[dict[str, Any]], messages: Sequence[Message]) -> list[bytes]:
    """``out[i]`` identifies (tools, messages[:i]); computed in one pass."""
    h = hashlib.blake2b(canonical_json(list(tools)), digest_size=16)
    out = [h.digest()]
    for m in messages:
        h.update(message_key(m))
        h.update(b"\x1e")
        out.append(h.digest())
    return out


def reuse_key(prefix_hash: bytes, assistant: Message) -> bytes:
    return hashlib.blake2b(prefix_hash + message_key(assistant), digest_size=16).digest()


@dataclass
class Prompt:
    ids: list[int]
    reuse: dict[str, Any]  # goes to CallRecord.metadata["prompt_reuse"]
    prefix_hashes: list[bytes]
    text: str = ""  # the rendering the ids encode (hashed into the record when the engine rejects the prompt)


def text_sha256(text: str) -> str:
    """What identifies a rendered prompt in the record of a rejected call (its ids are not kept).

    Hashed a megabyte at a time: ``update`` releases the GIL, so hashing a huge prompt on a worker
    thread never holds up the event loop."""
    h = hashlib.sha256()
    step = 1 << 20
    for i in range(0, len(text), step):
        h.update(text[i : i + step].encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class PromptTooLong(ContextLengthExceeded):
    """The rendered prompt does not fit the context window. Raised before its ids become a Python list
    (``at_least``: the count is a floor: tokenizing stopped, or never started, once the limit was
    certainly passed). Carries the rendering's hash for the call's record."""

    def __init__(self, prompt_tokens: int, context_length: int, *, at_least: bool, text: str) -> None:
        super().__init__(prompt_tokens, context_length, at_least=at_least)
        self.prompt_sha256 = text_sha256(text)


def max_chars_per_token(tokenizer: Any) -> int | None:
    """The most characters of rendered text one token can stand for, or ``None`` when no such bound is
    certain. It lets a prompt that cannot fit be refused from its length alone, before tokenizing.

    For a BPE model every token is one vocabulary piece, and a piece covers at most as many characters
    of the (normalized) text as it has: byte-level pieces spell one character per byte, SentencePiece
    pieces one per character, byte-fallback pieces (``<0x41>``) more. NFC/NFKC normalization can
    compose at most 4 code points into one. Any other normalizer, a non-BPE model (WordPiece maps a
    whole unknown word to one ``[UNK]``) or fused unknown pieces: no bound."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ != "BPE" or getattr(backend.model, "fuse_unk", False):
        return None
    normalizer = backend.normalizer
    factor = 1 if normalizer is None else 4 if type(normalizer).__name__ in ("NFC", "NFKC") else None
    if factor is None:
        return None
    try:
        longest = max(len(piece) for piece in tokenizer.get_vocab())  # added tokens included
    except (AttributeError, TypeError, ValueError):
        return None
    return max(1, longest) * factor


WINDOW_CHARS = 1 << 18  # characters a control-token scan searches at a time (a few ms of the GIL at most)


def finditer_windowed(pattern: re.Pattern[str], text: str, max_match_chars: int,
                      window_chars: int = WINDOW_CHARS) -> Iterator[re.Match[str]]:
    """``pattern.finditer(text)`` for a pattern none of whose matches is longer than ``max_match_chars``
    (and none empty), searched a window at a time. A regex search holds the GIL for as long as it scans;
    over a window it holds it for milliseconds, over a hostile 8 MiB prompt for a few hundred, and a
    gateway on a worker thread would stall the event loop for that long. Each window overlaps the next by
    ``max_match_chars``, and a match is taken only when it starts before the overlap, so every match is
    the one ``finditer`` finds."""
    n, pos = len(text), 0
    while pos < n:
        m = pattern.search(text, pos, min(n, pos + window_chars + max_match_chars))
        if m is None or m.start() >= pos + window_chars:
            pos += window_chars
            continue
        yield m
        pos = m.end()


@dataclass(frozen=True)
class ControlTokens:
    """transformers' control-token sanitizing (``mark_control_tokens`` / ``encode_marked_chat``): text a
    client sends that spells a control token (``<|im_end|>`` in a tool result) is encoded as plain text,
    never as the control token. Scans a window at a time (``finditer_windowed``), with the same results."""

    start: str
    end: str
    control_re: re.Pattern[str]  # any control token, longest first
    markers_re: re.Pattern[str]  # a marked token (group 1) or a lone marker
    changes_re: re.Pattern[str]  # what marking changes: a control token or a marker
    longest: int  # characters of the longest control token

    @classmethod
    def of(cls, tokenizer: Any) -> ControlTokens | None:
        try:
            from transformers.utils import chat_template_utils as ctu

            tokens = tuple(tokenizer.added_tokens_encoder)
            control_re, markers_re = ctu._get_control_token_patterns(tokens)
            start, end = ctu._CONTROL_TOKEN_START, ctu._CONTROL_TOKEN_END
        except (ImportError, AttributeError, TypeError):
            return None
        changes_re = re.compile(f"{control_re.pattern}|[{re.escape(start + end)}]")
        return cls(start, end, control_re, markers_re, changes_re, max(map(len, tokens), default=1))

    def changes(self, text: str) -> bool:
        if len(text) <= WINDOW_CHARS:  # one window: one search (most strings of a call)
            return self.changes_re.search(text) is not None
        return next(finditer_windowed(self.changes_re, text, self.longest), None) is not None

    def mark(self, obj: Any) -> Any:
        """``mark_control_tokens(obj)``: markers already in a string dropped, control tokens wrapped in them."""
        if isinstance(obj, str):
            text = obj.replace(self.start, "").replace(self.end, "")
            out: list[str] = []
            last = 0
            for m in finditer_windowed(self.control_re, text, self.longest):
                out += (text[last : m.start()], self.start, m.group(), self.end)
                last = m.end()
            out.append(text[last:])
            return "".join(out)
        if isinstance(obj, dict):
            return {key: self.mark(value) for key, value in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.mark(value) for value in obj]
        return obj

    def split(self, text: str) -> list[str | None]:
        """``markers_re.split(text)``: [text, marked token or None (a lone marker), text, ...]."""
        out: list[str | None] = []
        last = 0
        for m in finditer_windowed(self.markers_re, text, self.longest + 2):
            out += (text[last : m.start()], m.group(1))
            last = m.end()
        out.append(text[last:])
        return out


class PromptBuilder:
    """Render + tokenize with one tokenizer; ``lookup(key)`` finds an earlier call of the session."""

    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = [int(i) for i in stop_token_ids]
        self._eot_id = self.stop_token_ids[0] if self.stop_token_ids else None
        self._eot_strs = [s for s in tokenizer.convert_ids_to_tokens(self.stop_token_ids) if s]
        self.encode = _encoder(tokenizer)
        self.max_chars_per_token = max_chars_per_token(tokenizer)
        self.segments = SegmentEncoder.build(tokenizer, self.encode)
        if self.segments is not None:
            self.encode = self.segments.encode
        self.control = ControlTokens.of(tokenizer)
        self._compiled = self._fast_template()

    def _mark(self, obj: Any) -> Any:
        """``obj`` with the control tokens in its strings marked; ``obj`` itself when marking would change
        nothing (no string holds a control token or a marker, no tuple): the usual call, spared a deep copy."""
        control = self.control
        if control is None or _unmarked(obj, control.changes):
            return obj
        return control.mark(obj)

    def encode_rendered(self, text: str, limit: int | None = None, inline_chars: int | None = None) -> list[int]:
        """Tokenize a rendering of marked messages (the fast path when nothing was marked); past
        ``limit`` tokens, ``TooManyTokens``: at once when the text is too long to fit whatever it holds.
        With ``inline_chars`` (on the event loop): ``WouldBlock`` when more text than that is not cached."""
        if limit is not None:
            floor = self.min_tokens(text)
            if floor > limit:
                raise TooManyTokens(floor)
        control = self.control
        plain = control is None or control.start not in text
        if inline_chars is not None:
            if plain and self.segments is not None:
                return self.segments.encode(text, limit, inline_chars)
            if len(text) > inline_chars:
                raise WouldBlock
        if control is None or plain:
            return self.encode(text) if limit is None else self.encode(text, limit)
        return self._encode_marked(control, text, limit)

    def _encode_marked(self, control: ControlTokens, text: str, limit: int | None) -> list[int]:
        """transformers' ``encode_marked_chat``, with the text between marked tokens encoded by the fast
        path (past ``limit``: ``TooManyTokens`` before an id list exists) and the split done a window at a
        time, so neither holds the GIL for a whole huge prompt."""
        from transformers.utils import chat_template_utils as ctu

        pieces = control.split(text)
        newline_ids = self.tokenizer.encode("\n", add_special_tokens=False)
        ids = self._encode_upto(pieces[0] or "", limit, 0)
        for i, piece in enumerate(pieces[1:], start=1):
            if not piece:
                continue
            if i % 2 == 1:  # a marked token: encoded as plain text
                piece_ids = ctu._encode_chat_piece(self.tokenizer, piece, True, newline_ids)
                if self.tokenizer.convert_tokens_to_ids(piece) in piece_ids:
                    raise ValueError(f"Can't sanitize {piece!r}: the tokenizer produces it from plain text")
            else:  # after a newline, so SentencePiece adds no prefix space; the newline is dropped again
                piece_ids = self._encode_upto("\n" + piece, limit, len(ids) - len(newline_ids))
                if piece_ids[: len(newline_ids)] == newline_ids:
                    piece_ids = piece_ids[len(newline_ids) :]
                else:
                    piece_ids = self._encode_upto(piece, limit, len(ids))
            ids += piece_ids
            if limit is not None and len(ids) > limit:
                raise TooManyTokens(len(ids))
        return ids

    def _encode_upto(self, text: str, limit: int | None, before: int) -> list[int]:
        """``self.encode(text)`` when ``before`` ids come first; ``TooManyTokens`` (counting them) past ``limit``."""
        if limit is None:
            return self.encode(text)
        try:
            return self.encode(text, max(0, limit - before))
        except TooManyTokens as e:
            raise TooManyTokens(max(0, before) + e.count) from None

    def min_tokens(self, text: str) -> int:
        """A floor of the token count of a rendering, from its length alone (0 when there is no bound)."""
        if self.max_chars_per_token is None:
            return 0
        chars = len(text)
        control = self.control
        if control is not None and control.start in text:  # markers are dropped before encoding
            chars -= text.count(control.start) + text.count(control.end)
        return chars // self.max_chars_per_token

    def render(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], generation: bool) -> str:
        if self._compiled is not None:
            template, extra = self._compiled
            return template.render(messages=messages, tools=list(tools) or None, documents=None,
                                   add_generation_prompt=generation, **extra)
        return self._render_hf(messages, tools, generation)

    def _render_hf(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], generation: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) or None, tokenize=False, add_generation_prompt=generation
        )

    def _fast_template(self) -> tuple[Any, dict[str, Any]] | None:
        """The compiled Jinja template, rendered directly (skips per-call copies of the conversation).

        Used only when it renders a probe conversation exactly as ``apply_chat_template`` does."""
        template = getattr(self.tokenizer, "chat_template", None)
        if not isinstance(template, str):
            return None
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            # our own Template from transformers' sandboxed environment (theirs is cached and shared), with
            # its globals flattened once: each render copies them, and a ChainMap copies key by key in Python
            compiled = _compile_jinja_template(template).environment.from_string(template)
            compiled.globals = dict(compiled.globals)
            extra = dict(getattr(self.tokenizer, "special_tokens_map", {}) or {})
            tools: list[dict[str, Any]] = [{"type": "function", "function": {"name": "f", "description": "d",
                                                       "parameters": {"type": "object", "properties": {}}}}]
            probe: list[dict[str, Any]] = [
                {"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a", "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
                {"role": "tool", "tool_call_id": "c", "content": "r"},
            ]
            for t in ([], tools):
                for gen in (True, False):
                    fast = compiled.render(messages=probe, tools=t or None, documents=None, add_generation_prompt=gen, **extra)
                    if fast != self._render_hf(probe, t, gen):
                        return None
            return compiled, extra
        except Exception:  # any doubt: the slower, canonical path
            return None

    def build(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], lookup: Any,
              context_length: int | None = None, inline_chars: int | None = None) -> Prompt:
        """Token ids for ``messages``; ``lookup(reuse_key) -> CallRecord | None`` searches this session only.

        With ``context_length``, a prompt that leaves no room to generate raises ``PromptTooLong`` as
        early as that is certain: from the rendering's length before tokenizing, else as soon as the
        tokenizer has passed the limit, before any id list is built. So an oversized request costs
        neither the time to tokenize it nor the memory of its ids. Runs on a worker thread, or on the event
        loop with ``inline_chars``: then ``WouldBlock`` before tokenizing more uncached text than that."""
        hashes = prefix_hashes(tools, messages)  # keys use the messages as sent; rendering uses marked copies
        marked, marked_tools = self._mark(list(messages)), self._mark(list(tools))
        full = self.render(marked, marked_tools, generation=True)
        limit = None if context_length is None else context_length - 1  # room for one sampled token
        try:
            return self._build(messages, marked, marked_tools, full, hashes, lookup, limit, inline_chars)
        except TooManyTokens as e:
            raise PromptTooLong(e.count, context_length, at_least=True, text=full) from None  # type: ignore[arg-type]

    def _build(self, messages: Sequence[Message], marked: Sequence[Message], marked_tools: Sequence[dict[str, Any]],
               full: str, hashes: list[bytes], lookup: Any, limit: int | None, inline_chars: int | None) -> Prompt:
        for k in range(len(messages) - 1, -1, -1):
            if messages[k].get("role") != "assistant":
                continue
            rec = lookup(reuse_key(hashes[k], messages[k]))
            if rec is None:
                continue
            spliced = self._splice(marked[: k + 1], marked_tools, full, rec, limit, inline_chars)
            if spliced is not None:
                reuse = {"call_index": rec.call_index, "reused_ids": len(rec.prompt_ids) + len(rec.sampled_ids)}
                return Prompt(spliced, reuse, hashes, full)
            reuse = {"call_index": rec.call_index, "broken": "template rewrote history"}
            return Prompt(self.encode_rendered(full, limit, inline_chars), reuse, hashes, full)
        return Prompt(self.encode_rendered(full, limit, inline_chars), {}, hashes, full)

    def _splice(self, upto: Sequence[Message], tools: Sequence[dict[str, Any]], full: str, rec: Any,
                limit: int | None = None, inline_chars: int | None = None) -> list[int] | None:
        head = self.render(upto, tools, generation=False)
        if not full.startswith(head):
            return None
        cut = max(((head.rfind(s), s) for s in self._eot_strs), default=(-1, ""))
        if cut[0] < 0:
            return None
        tail = full[cut[0] + len(cut[1]) :]
        ids = list(rec.prompt_ids) + list(rec.sampled_ids)
        if self._eot_id is not None and (not rec.sampled_ids or rec.sampled_ids[-1] not in self.stop_token_ids):
            ids.append(self._eot_id)  # the turn was cut (length/stop string): close it as the template would
        try:
            ids.extend(self.encode_rendered(tail, None if limit is None else max(0, limit - len(ids)), inline_chars))
        except TooManyTokens as e:
            raise TooManyTokens(len(ids) + e.count) from None
        if limit is not None and len(ids) > limit:
            raise TooManyTokens(len(ids))
        return ids


def _unmarked(obj: Any, changes: Callable[[str], bool]) -> bool:
    """True when ``mark_control_tokens(obj)`` would equal ``obj``: ``changes(s)`` is false for every one of
    its strings, and it holds no tuple (marking turns them into lists)."""
    if isinstance(obj, str):
        return not changes(obj)
    if isinstance(obj, dict):
        return all(_unmarked(v, changes) for v in obj.values())
    if isinstance(obj, list):
        return all(_unmarked(v, changes) for v in obj)
    return not isinstance(obj, tuple)


def _encoder(tokenizer: Any) -> Any:
    """``encode(text, limit=None) -> ids`` with the tokenizer's fastest exact path. Past ``limit`` tokens it
    raises ``TooManyTokens`` from the encoding's length, before its ids become a Python list (turning
    millions of ids into ints is what holds the GIL). The Rust tokenizer releases the GIL while encoding."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch_fast"):  # same ids, no offsets: half the cost
        def encoding(text: str) -> Any:
            return backend.encode_batch_fast([text], add_special_tokens=False)[0]
    elif backend is not None:
        def encoding(text: str) -> Any:
            return backend.encode_batch([text], add_special_tokens=False)[0]
    else:
        def encode_slow(text: str, limit: int | None = None) -> list[int]:
            ids = tokenizer.encode(text, add_special_tokens=False)
            if limit is not None and len(ids) > limit:
                raise TooManyTokens(len(ids))
            return ids

        return encode_slow

    def encode(text: str, limit: int | None = None) -> list[int]:
        enc = encoding(text)
        if limit is not None and len(enc) > limit:
            raise TooManyTokens(len(enc))
        return enc.ids

    return encode
