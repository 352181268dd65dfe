"""ScriptedEngine: chosen text (e.g. a tool call) through the real tokenizer, with real logprobs."""

from __future__ import annotations

import asyncio

import pytest

from polar.inference import EngineError, GenerationRequest, collect
from polar.inference.embedded import sequence_logprobs
from polar.inference.scripted import ScriptedEngine

from .conftest import chat_prompt

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_scripted_tool_call_uses_real_ids_and_real_logprobs(tiny_pair):
    model, tok = tiny_pair
    engine = ScriptedEngine(tok, [TOOL_CALL, "It is sunny."], model=model)
    prompt = chat_prompt(tok, "weather in Paris?")

    async def go():
        first = await collect(
            engine.generate(GenerationRequest(prompt, stop_token_ids=engine.default_stop_token_ids))
        )
        second = await collect(engine.generate(GenerationRequest(prompt, max_tokens=2)))
        with pytest.raises(EngineError, match="ran out of scripted responses"):
            await collect(engine.generate(GenerationRequest(prompt)))
        return first, second

    first, second = asyncio.run(go())
    assert tok.decode(first.token_ids) == TOOL_CALL + "<|im_end|>"
    assert tok.convert_ids_to_tokens(first.token_ids[0]) == "<tool_call>"
    assert first.finish_reason == "stop"
    ref = sequence_logprobs(model, prompt + first.token_ids)[len(prompt) - 1 :]
    assert max(abs(a - b) for a, b in zip(ref, first.logprobs, strict=False)) < 1e-4
    assert second.finish_reason == "length" and len(second.token_ids) == 2
    assert [r.prompt_ids for r in engine.requests[:2]] == [prompt, prompt]


def test_scripted_without_model_uses_the_fixed_logprob_and_a_callable_script(tiny_pair):
    tok = tiny_pair[1]
    engine = ScriptedEngine(tok, lambda req, i: f"reply {i}", fixed_logprob=-2.0)
    result = asyncio.run(collect(engine.generate(GenerationRequest([1, 2, 3]))))
    assert tok.decode(result.token_ids) == "reply 0<|im_end|>"
    assert set(result.logprobs) == {-2.0}
