"""The upstream servers' wire formats: token-id requests out, (token id, logprob, finish) triples back.

- vLLM: ``POST /v1/completions`` with ``prompt`` as a list of ids, ``logprobs: 0`` (the sampled token's only),
  ``return_token_ids`` and ``return_tokens_as_token_ids``; ids come from ``choices[0].token_ids`` (fallback:
  the ``token_id:N`` strings in ``logprobs.tokens``), logprobs from ``logprobs.token_logprobs``. vLLM
  returns raw-model logprobs by default (its ``--logprobs-mode raw_logprobs``).
- SGLang: ``POST /generate`` with ``input_ids``, ``sampling_params`` and ``return_logprob``; ids and
  logprobs come from ``output_ids`` and ``meta_info.output_token_logprobs`` (``[logprob, id, text]``).
  Streams may be cumulative (the default) or incremental (``--incremental-streaming-output``); both are
  handled. SGLang versions differ on whether logprobs are taken before or after temperature scaling
  (see its ``SGLANG_RETURN_ORIGINAL_LOGPROB`` setting); check yours when sampling at temperature != 1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Protocol

import httpx
import orjson

from polar.inference.base import EngineError, FinishReason, GenerationRequest
from polar.inference.upstream.config import UpstreamKind

# the hot path parses ~one JSON object per token; orjson is several times faster than json
_loads = orjson.loads

#: One sampled token as a server reports it: (id, logprob, finish reason on the last one). A finish with no
#: token (a stream's closing chunk) is ``(None, None, finish)``.
Triple = tuple[int | None, float | None, FinishReason | None]


class ReplicaFailed(Exception):
    """This replica failed (refused, errored, answered garbage) before any token was streamed: try another."""


class Parser(Protocol):
    def __call__(self, chunk: dict[str, Any]) -> list[Triple]: ...


@dataclass(frozen=True)
class WireCall:
    """One generation call to one replica: the path, the JSON body and the parser of its answers."""

    path: str
    body: bytes
    parse: Parser


def call_for(kind: UpstreamKind, request: GenerationRequest, max_tokens: int, served_model: str | None) -> WireCall:
    """The call ``kind``'s server takes for ``request`` (vLLM needs its ``served_model`` id)."""
    if kind == "vllm":
        return WireCall("/v1/completions", orjson.dumps(vllm_body(request, max_tokens, served_model or "")),
                        VllmParser(request.prompt_ids))
    return WireCall("/generate", orjson.dumps(sglang_body(request, max_tokens)), SglangParser())


def vllm_body(request: GenerationRequest, max_tokens: int, served_model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": served_model,
        "prompt": list(request.prompt_ids),
        "max_tokens": max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop_token_ids": list(request.stop_token_ids),
        "logprobs": 0,  # the sampled token's logprob only: no top-k gather, no per-token top dict
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "stream": request.stream,
    }
    if request.seed is not None:
        body["seed"] = request.seed
    return body


def sglang_body(request: GenerationRequest, max_tokens: int) -> dict[str, Any]:
    params: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop_token_ids": list(request.stop_token_ids),
        "skip_special_tokens": False,
    }
    if request.seed is not None:
        params["sampling_seed"] = request.seed
    return {
        "input_ids": list(request.prompt_ids),
        "sampling_params": params,
        "return_logprob": True,
        "stream": request.stream,
    }


async def sse_payloads(resp: httpx.Response) -> AsyncIterator[Any]:
    """Yield the JSON objects of an SSE stream (``data: {...}`` events) up to ``data: [DONE]``.

    Works on raw bytes (split on blank lines) rather than decoded text lines: a third of the cost."""
    done = False
    buf = b""
    async for chunk in resp.aiter_bytes():  # read to EOF, so the connection is reused, not closed
        if done:
            continue
        buf += chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *events, buf = buf.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                yield payload(data)
            if done:
                break
    if not done and buf.strip():
        for line in buf.split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                yield payload(line[5:].strip())


def payload(data: bytes) -> Any:
    """One JSON answer; malformed JSON or an ``error`` field fails the replica (the call may move)."""
    try:
        parsed = _loads(data)
    except ValueError as exc:
        raise ReplicaFailed(f"malformed upstream JSON: {data[:200]!r}") from exc
    if isinstance(parsed, dict) and "error" in parsed:
        raise ReplicaFailed(f"upstream error: {str(parsed['error'])[:300]}")
    return parsed


def _with_finish(out: list[Triple], finish: FinishReason | None) -> list[Triple]:
    if finish is None:
        return out
    if not out:
        return [(None, None, finish)]
    out[-1] = (out[-1][0], out[-1][1], finish)
    return out


class VllmParser:
    """Turn vLLM /v1/completions stream chunks into (id, logprob, finish) triples."""

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt_ids = list(prompt_ids)

    def __call__(self, chunk: dict[str, Any]) -> list[Triple]:
        choices = chunk.get("choices") or []
        if not choices:
            return []  # e.g. a usage-only chunk
        choice = choices[0]
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and list(echoed) != self.prompt_ids:
            raise EngineError(
                "vLLM reports different prompt_token_ids than were sent; capture would be unfaithful"
            )
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs") or []
        ids = choice.get("token_ids")
        if ids is None:  # older vLLM: recover ids from "token_id:N" strings
            ids = [_id_from_token_string(t) for t in lp.get("tokens") or []]
        if len(logprobs) != len(ids):
            raise EngineError(
                f"vLLM chunk has {len(ids)} token ids but {len(logprobs)} logprobs; enable logprobs on the server"
            )
        # converted and zipped in C: a whole non-streamed answer comes through here at once
        floats = map(float, logprobs) if None not in logprobs else (0.0 if p is None else float(p) for p in logprobs)
        out: list[Triple] = list(zip(map(int, ids), floats, repeat(None, len(ids)), strict=True))
        return _with_finish(out, finish_reason(choice.get("finish_reason")))


class SglangParser:
    """Turn SGLang /generate stream chunks (cumulative or incremental) into (id, logprob, finish) triples."""

    def __init__(self) -> None:
        self.emitted = 0

    def __call__(self, chunk: dict[str, Any]) -> list[Triple]:
        meta = chunk.get("meta_info") or {}
        ids = list(chunk.get("output_ids") or [])
        lps = list(meta.get("output_token_logprobs") or [])
        total = int(meta.get("completion_tokens", len(ids)))
        if len(ids) == total:  # cumulative chunk (SGLang's default): keep only the new tail
            ids = ids[self.emitted :]
            if len(lps) == total:
                lps = lps[self.emitted :]
        if len(lps) != len(ids):
            raise EngineError(
                f"SGLang chunk has {len(ids)} new ids but {len(lps)} logprobs; send return_logprob=true"
            )
        out: list[Triple] = []
        for token_id, entry in zip(ids, lps, strict=False):
            logprob, lp_id = entry[0], entry[1]
            if int(lp_id) != int(token_id):
                raise EngineError(f"SGLang logprob entry is for token {lp_id} but output id is {token_id}")
            out.append((int(token_id), float(logprob if logprob is not None else 0.0), None))
        self.emitted += len(out)
        reason = meta.get("finish_reason")
        return _with_finish(out, finish_reason(reason.get("type") if isinstance(reason, dict) else reason))


def finish_reason(reason: object) -> FinishReason | None:
    """A server's finish reason as polar's: ``stop`` and ``length`` as they are, anything else ``abort``."""
    if reason is None:
        return None
    if reason == "stop":
        return "stop"
    return "length" if reason == "length" else "abort"


def _id_from_token_string(token: object) -> int:
    if not isinstance(token, str) or not token.startswith("token_id:"):
        raise EngineError("vLLM returned neither token_ids nor 'token_id:N' tokens; upgrade vLLM (>= 0.10.2)")
    return int(token.removeprefix("token_id:"))
