"""``ScriptedEngine``: an engine whose outputs are chosen by the test or doc that builds it.

A random tiny model will never emit a well-formed tool call, so tests of tool-call round trips (and of
the Claude Code / Codex presets) script the text instead. The scripted text is encoded with the real
tokenizer; those ids are streamed like any engine's output. Logprobs:

- with ``model=`` (e.g. the tiny model): **real** raw-model logprobs (log-softmax at temperature 1) of
  the scripted ids given the prompt, from one forward pass, so token-faithfulness checks hold;
- without a model: the fixed value ``fixed_logprob`` for every token (document-only / stand-in use).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from polar.inference.base import Engine, EngineError, FinishReason, GenerationRequest, TokenEvent

Script = str | Sequence[int]


class ScriptedEngine(Engine):
    """Replays ``responses`` in order, one per ``generate`` call (or asks ``responses(request, index)``).

    A text response is encoded without special tokens and followed by ``end_token`` (``<|im_end|>``),
    finishing with ``"stop"``; an id list is emitted as given (``"stop"`` if its last id is one of the
    request's stop ids, else ``"length"``). ``max_tokens`` truncates either, finishing with ``"length"``.
    Every request is kept in ``self.requests`` for assertions.
    """

    def __init__(
        self,
        tokenizer: Any,
        responses: Iterable[Script] | Callable[[GenerationRequest, int], Script],
        *,
        model: Any = None,
        fixed_logprob: float = -1.0,
        end_token: str = "<|im_end|>",
        model_name: str = "scripted",
        context_length: int = 4096,
        token_delay_s: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.model_name = model_name
        self.context_length = context_length
        self.policy_version = 0
        self.fixed_logprob = float(fixed_logprob)
        self.token_delay_s = token_delay_s
        self.max_top_logprobs = 20 if model is not None else 0  # alternatives need the model's logits
        self._script = responses if callable(responses) else list(responses)
        self._end_id = tokenizer.convert_tokens_to_ids(end_token)
        eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        self.default_stop_token_ids = [i for i in (self._end_id, eot) if isinstance(i, int) and i >= 0]
        self.requests: list[GenerationRequest] = []
        self._closed = False
        self._aborts = 0  # bumped by abort_inflight: streams started before it end with "abort"
        self._streaming = 0

    @classmethod
    def tiny(cls, responses: Any, *, seed: int = 0, **kwargs: Any) -> ScriptedEngine:
        """A scripted engine over the tiny preset's tokenizer, with real logprobs from the tiny model."""
        from polar.inference.tiny import build_tiny

        model, tokenizer = build_tiny(seed)
        kwargs.setdefault("model_name", "tiny")
        return cls(tokenizer, responses, model=model, **kwargs)

    def _next_ids(self, request: GenerationRequest) -> tuple[list[int], bool]:
        index = len(self.requests) - 1
        if callable(self._script):
            item = self._script(request, index)
        else:
            if index >= len(self._script):
                raise EngineError(
                    f"ScriptedEngine ran out of scripted responses: call {index + 1} but only "
                    f"{len(self._script)} given"
                )
            item = self._script[index]
        if isinstance(item, str):
            return [*self.tokenizer.encode(item, add_special_tokens=False), self._end_id], True
        ids = [int(t) for t in item]
        return ids, bool(ids) and ids[-1] in request.stop_token_ids

    def _logprobs(self, prompt_ids: list[int], ids: list[int]) -> list[float]:
        if self.model is None or not ids:
            return [self.fixed_logprob] * len(ids)
        from polar.inference.embedded import sequence_logprobs

        return sequence_logprobs(self.model, prompt_ids + ids)[len(prompt_ids) - 1 :]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self._closed:
            raise EngineError("ScriptedEngine is closed")
        max_tokens = self.check_prompt(request)
        self.requests.append(request)
        ids, stopped = self._next_ids(request)
        finish: FinishReason = "stop" if stopped else "length"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        if not ids:
            raise EngineError("ScriptedEngine: scripted response is empty; script at least one token")
        logprobs = await asyncio.to_thread(self._logprobs, list(request.prompt_ids), ids)
        tops: list[Any] = [None] * len(ids)
        if request.top_logprobs and self.model is not None:
            from polar.inference.sampling import sequence_top_logprobs

            tops = await asyncio.to_thread(sequence_top_logprobs, self.model, list(request.prompt_ids) + ids,
                                           len(request.prompt_ids), request.top_logprobs)
        epoch = self._aborts
        self._streaming += 1
        try:
            for i, (tid, lp, top) in enumerate(zip(ids, logprobs, tops, strict=False)):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                if self._closed or self._aborts != epoch:
                    yield TokenEvent(None, None, "abort", self.policy_version)
                    return
                last = i == len(ids) - 1
                yield TokenEvent(tid, lp, finish if last else None, self.policy_version if last else None, top)
        finally:
            self._streaming -= 1

    async def abort_inflight(self) -> int:
        self._aborts += 1
        return self._streaming

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        if self.model is not None:
            from polar.inference.embedded import load_weights

            await asyncio.to_thread(load_weights, self.model, state_dict)
        self.policy_version = int(version)

    async def close(self) -> None:
        self._closed = True

    async def health(self) -> dict[str, Any]:
        return {"state": "unavailable", "error": "engine is closed"} if self._closed else {"state": "ok"}
