"""One chat turn from any engine, as text: what judges (and other LLM helpers inside the loop) call.

A text-level engine (``engine: openai_compat``) takes the messages as they are; a token engine (embedded,
vLLM, the tiny preset) renders them with its tokenizer's chat template, samples, and decodes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from polar.inference.base import Engine, GenerationRequest, collect


def chat_function(engine: Engine, max_tokens: int = 512, temperature: float = 0.0
                  ) -> Callable[[list[dict[str, str]]], Awaitable[str]]:
    """``await ask(messages) -> reply text`` on ``engine`` (greedy by default: a judge should be repeatable)."""

    async def ask(messages: list[dict[str, str]]) -> str:
        if getattr(engine, "text_level", False):
            chat: Any = engine
            body = chat.body(messages, [], "auto", max_tokens, temperature, 1.0, [], None, False)
            result = None
            async for item in chat.chat(body):
                result = item
            return str(getattr(result, "content", "") or "")
        tok = engine.tokenizer
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = list(tok.encode(text, add_special_tokens=False))
        request = GenerationRequest(prompt_ids=ids, max_tokens=max_tokens, temperature=temperature,
                                    stop_token_ids=list(engine.default_stop_token_ids))
        request.max_tokens = engine.check_prompt(request)
        out = await collect(engine.generate(request))
        stops = set(engine.default_stop_token_ids)
        return str(tok.decode([t for t in out.token_ids if t not in stops], skip_special_tokens=True))

    return ask
