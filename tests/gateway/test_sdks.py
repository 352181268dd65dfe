"""The official OpenAI, Anthropic and Google SDKs (and litellm) against a real gateway with the tiny model.

Each call's record must hold exactly what the engine consumed and sampled: the visible text is the
decode of the sampled ids, usage matches the ids, and the recorded logprobs equal a fresh forward pass
of the same weights over prompt + sampled ids (token faithfulness, within 1e-4).
"""

from __future__ import annotations

import os

import httpx
import pytest

from polar.inference.embedded import sequence_logprobs

MAX_TOKENS = 12


def _text_of(rec, tokenizer, stop_ids) -> str:
    return tokenizer.decode([t for t in rec.sampled_ids if t not in stop_ids], skip_special_tokens=False)


def _check_faithful(rec, model) -> None:
    assert rec.complete and rec.error is None
    assert len(rec.sampled_ids) == len(rec.logprobs) >= 1
    full = rec.prompt_ids + rec.sampled_ids
    recomputed = sequence_logprobs(model, full)[len(rec.prompt_ids) - 1 :]
    assert max(abs(a - b) for a, b in zip(recomputed, rec.logprobs, strict=True)) < 1e-4


@pytest.fixture
def gw(gateway, embedded):
    return gateway(embedded, model_aliases=["gpt-test", "claude-test", "gemini-test"])


def test_openai_chat_non_streaming_then_streaming_multi_turn(gw, tiny):
    from openai import OpenAI

    model, tok = tiny
    stop_ids = gw.engine.default_stop_token_ids
    client = OpenAI(base_url=f"{gw.url}/s/oa-chat/v1", api_key="unused", max_retries=0)
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello"}]},
    ]
    r1 = client.chat.completions.create(model="gpt-test", messages=messages, max_tokens=MAX_TOKENS, temperature=0.8, seed=1)
    assert r1.model == "gpt-test" and r1.object == "chat.completion"
    assert r1.choices[0].finish_reason in ("stop", "length")
    messages.append({"role": "assistant", "content": r1.choices[0].message.content})
    messages.append({"role": "user", "content": "again"})
    chunks = list(client.chat.completions.create(
        model="gpt-test", messages=messages, max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage]

    rec1, rec2 = gw.records("oa-chat")
    assert r1.choices[0].message.content == _text_of(rec1, tok, stop_ids)
    assert r1.usage.prompt_tokens == len(rec1.prompt_ids) and r1.usage.completion_tokens == len(rec1.sampled_ids)
    assert streamed == _text_of(rec2, tok, stop_ids)
    assert finish == [rec2.finish_reason if rec2.finish_reason != "stop_sequence" else "stop"]
    assert usage[0].completion_tokens == len(rec2.sampled_ids)
    # turn 2 reuses turn 1's exact ids instead of re-tokenizing its text
    assert rec2.prompt_ids[: len(rec1.prompt_ids) + len(rec1.sampled_ids)] == rec1.prompt_ids + rec1.sampled_ids
    assert rec2.metadata["prompt_reuse"]["call_index"] == rec1.call_index
    assert rec1.messages[0] == {"role": "system", "content": "Be brief."}
    assert rec1.messages[1]["content"] == "Say\nhello"
    for rec in (rec1, rec2):
        assert rec.provider == "openai_chat" and rec.model == "gpt-test" and rec.policy_version == 0
        _check_faithful(rec, model)


def test_openai_chat_returns_logprobs_when_asked(gw):
    from openai import OpenAI

    client = OpenAI(base_url=f"{gw.url}/v1", api_key="lp-session", max_retries=0)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=5, logprobs=True)
    (rec,) = gw.records("lp-session")  # the API key names the session
    assert [c.logprob for c in r.choices[0].logprobs.content] == pytest.approx(rec.logprobs)


def test_openai_responses_non_streaming_and_streaming(gw, tiny):
    from openai import OpenAI

    model, tok = tiny
    stop_ids = gw.engine.default_stop_token_ids
    client = OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, default_headers={"x-polar-session": "oa-resp"})
    r = client.responses.create(model="gpt-test", instructions="Be brief.", input="hello", max_output_tokens=MAX_TOKENS)
    assert r.model == "gpt-test" and r.status in ("completed", "incomplete")
    events = list(client.responses.create(
        model="gpt-test", input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                                 {"role": "assistant", "content": r.output_text},
                                 {"role": "user", "content": "more"}],
        instructions="Be brief.", max_output_tokens=MAX_TOKENS, stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    rec1, rec2 = gw.records("oa-resp")
    assert r.output_text == _text_of(rec1, tok, stop_ids)
    assert r.usage.output_tokens == len(rec1.sampled_ids)
    assert streamed == _text_of(rec2, tok, stop_ids) == events[-1].response.output_text
    assert rec1.messages[0] == {"role": "system", "content": "Be brief."}
    for rec in (rec1, rec2):
        assert rec.provider == "openai_responses"
        _check_faithful(rec, model)


def test_anthropic_non_streaming_and_streaming(gw, tiny):
    import anthropic

    model, tok = tiny
    stop_ids = gw.engine.default_stop_token_ids
    client = anthropic.Anthropic(base_url=f"{gw.url}/s/anth", api_key="x", max_retries=0)
    msg = client.messages.create(model="claude-test", max_tokens=MAX_TOKENS, system="Be brief.",
                                 messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}])
    assert msg.model == "claude-test" and msg.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(model="claude-test", max_tokens=MAX_TOKENS, system="Be brief.", messages=[
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": msg.content[0].text},
        {"role": "user", "content": "more"}]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    rec1, rec2 = gw.records("anth")
    assert msg.content[0].text == _text_of(rec1, tok, stop_ids)
    assert msg.usage.input_tokens == len(rec1.prompt_ids) and msg.usage.output_tokens == len(rec1.sampled_ids)
    assert streamed == _text_of(rec2, tok, stop_ids)
    assert final.usage.output_tokens == len(rec2.sampled_ids)
    assert rec1.messages[0] == {"role": "system", "content": "Be brief."}
    for rec in (rec1, rec2):
        assert rec.provider == "anthropic"
        _check_faithful(rec, model)


def test_gemini_non_streaming_and_streaming(gw, tiny):
    from google import genai
    from google.genai import types

    model, tok = tiny
    stop_ids = gw.engine.default_stop_token_ids
    client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{gw.url}/s/gem", api_version="v1beta"))
    cfg = types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=MAX_TOKENS, temperature=0.7)
    r = client.models.generate_content(model="gemini-test", contents="hello", config=cfg)
    assert r.candidates[0].finish_reason in (types.FinishReason.STOP, types.FinishReason.MAX_TOKENS)
    chunks = list(client.models.generate_content_stream(model="gemini-test", contents=[
        types.Content(role="user", parts=[types.Part(text="hello")]),
        types.Content(role="model", parts=[types.Part(text=r.text or "")]),
        types.Content(role="user", parts=[types.Part(text="more")])], config=cfg))
    streamed = "".join(c.text or "" for c in chunks)
    rec1, rec2 = gw.records("gem")
    assert (r.text or "") == _text_of(rec1, tok, stop_ids)
    assert r.usage_metadata.candidates_token_count == len(rec1.sampled_ids)
    assert streamed == _text_of(rec2, tok, stop_ids)
    assert rec1.messages[0] == {"role": "system", "content": "Be brief."} and rec1.model == "gemini-test"
    for rec in (rec1, rec2):
        assert rec.provider == "gemini"
        _check_faithful(rec, model)


def test_litellm_openai_anthropic_and_gemini_routes(gw, tiny):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    model, tok = tiny
    stop_ids = gw.engine.default_stop_token_ids
    msgs = [{"role": "user", "content": "hello"}]
    r = litellm.completion(model="openai/gpt-test", api_base=f"{gw.url}/s/ll-oa/v1", api_key="x",
                           messages=msgs, max_tokens=MAX_TOKENS)
    chunks = list(litellm.completion(model="openai/gpt-test", api_base=f"{gw.url}/s/ll-oa/v1", api_key="x",
                                     messages=msgs, max_tokens=MAX_TOKENS, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    a = litellm.completion(model="anthropic/claude-test", api_base=f"{gw.url}/s/ll-anth", api_key="x",
                           messages=msgs, max_tokens=MAX_TOKENS)
    g = litellm.completion(model="gemini/gemini-test", api_base=f"{gw.url}/s/ll-gem/v1beta", api_key="x",
                           messages=msgs, max_tokens=MAX_TOKENS)
    rec1, rec2 = gw.records("ll-oa")
    (rec3,) = gw.records("ll-anth")
    (rec4,) = gw.records("ll-gem")
    assert (g.choices[0].message.content or "") == _text_of(rec4, tok, stop_ids) and rec4.provider == "gemini"
    assert (r.choices[0].message.content or "") == _text_of(rec1, tok, stop_ids)
    assert streamed == _text_of(rec2, tok, stop_ids)
    assert (a.choices[0].message.content or "") == _text_of(rec3, tok, stop_ids)
    assert rec3.provider == "anthropic"
    for rec in (rec1, rec2, rec3, rec4):
        _check_faithful(rec, model)


def test_models_endpoint_and_health(gw):
    from openai import OpenAI

    models = OpenAI(base_url=f"{gw.url}/v1", api_key="x").models.list()
    assert [m.id for m in models.data] == ["tiny", "gpt-test", "claude-test", "gemini-test"]
    assert httpx.get(f"{gw.url}/health", timeout=60).json()["status"] == "ok"
