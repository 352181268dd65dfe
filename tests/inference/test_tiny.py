"""The tiny preset: a real tokenizer and chat template, deterministic weights, loadable as a folder."""

from __future__ import annotations

import asyncio
import json

import torch

from polar.inference import GenerationRequest, collect
from polar.inference.embedded import EmbeddedEngine, sequence_logprobs
from polar.inference.tiny import MARKUP_TOKENS, SPECIAL_TOKENS, build_tiny, build_tiny_tokenizer, save_tiny

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def test_tokenizer_is_deterministic_and_special_tokens_are_single_ids(tiny_pair):
    tok = tiny_pair[1]
    again = build_tiny_tokenizer()
    assert tok.get_vocab() == again.get_vocab()
    for t in SPECIAL_TOKENS + MARKUP_TOKENS:
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == t
    text = 'héllo wörld 🚀 {"a": [1, 2]}\n\tdef f(x):\n    return x'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # byte-level: lossless
    assert tok.eos_token == "<|im_end|>"


def test_chat_template_renders_tools_tool_calls_and_results(tiny_pair):
    tok = tiny_pair[1]
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]) in text
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>\n" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\nSunny.<|im_end|>\n<|im_start|>assistant\n")
    # dict arguments render the same as the JSON string form
    messages[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    assert tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True) == text
    # without tools, a default system prompt is used when none is given
    plain = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert (
        plain
        == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )


def test_weights_are_seeded_and_a_saved_folder_loads_as_a_local_model(tiny_pair, tmp_path):
    model, tok = tiny_pair
    other, _ = build_tiny(0)
    for (name, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items(), strict=False):
        assert torch.equal(a, b), name
    different, _ = build_tiny(1)
    assert not torch.equal(model.lm_head.weight, different.lm_head.weight)

    folder = save_tiny(tmp_path / "tiny-model")
    engine = EmbeddedEngine.from_spec(str(folder), device="cpu")
    try:
        assert engine.model_name == "tiny-model"
        assert engine.tokenizer.get_vocab() == tok.get_vocab()
        assert engine.tokenizer.chat_template == tok.chat_template
        prompt = tok.encode(
            "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
        )
        req = GenerationRequest(prompt, max_tokens=6, temperature=1.0, seed=5)
        result = asyncio.run(collect(engine.generate(req)))
        assert len(result.token_ids) == 6 and result.finish_reason == "length"
        ref = sequence_logprobs(model, prompt + result.token_ids)[len(prompt) - 1 :]
        assert max(abs(a - b) for a, b in zip(ref, result.logprobs, strict=False)) < 1e-4
    finally:
        asyncio.run(engine.close())


def test_unknown_model_spec_says_what_to_pass(tmp_path):
    import pytest

    from polar.inference import EngineError, load_engine

    with pytest.raises(EngineError, match="neither 'tiny' nor a local Hugging Face model folder"):
        load_engine(str(tmp_path / "nope"))
    with pytest.raises(EngineError, match=r"unknown embedded engine option\(s\) devise; valid: .*device"):
        load_engine("tiny", devise="cpu")
    with pytest.raises(EngineError, match="apply to the embedded engine only"):
        load_engine("vllm:http://127.0.0.1:9", device="cpu")
