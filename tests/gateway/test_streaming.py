"""Streaming is real (tokens reach the client while the engine is still generating), stop strings are
cut exactly in every provider's shape, multi-byte text survives token splits, and a client that hangs
up mid-stream leaves an incomplete record (never a trainable one)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from polar.inference.base import Engine, GenerationRequest


class Tracked(Engine):
    """Delegates to another engine and notes when its stream has produced its last token.

    With ``hold_last`` (a threading.Event) the last token waits until the test sets it (at most 60 s), so
    "the engine has not finished yet" does not depend on how fast a loaded machine schedules the client."""

    def __init__(self, inner: Engine, hold_last: threading.Event | None = None) -> None:
        self.inner = inner
        self.tokenizer, self.model_name = inner.tokenizer, inner.model_name
        self.context_length, self.default_stop_token_ids = inner.context_length, inner.default_stop_token_ids
        self.finished = threading.Event()
        self.closed_early = threading.Event()
        self.hold_last = hold_last

    async def generate(self, request: GenerationRequest):
        self.finished.clear()
        done = False
        try:
            async for ev in self.inner.generate(request):
                if ev.finish_reason and self.hold_last is not None:
                    await asyncio.to_thread(self.hold_last.wait, 60)
                yield ev
                if ev.finish_reason:
                    done = True
                    self.finished.set()
        finally:
            if not done:
                self.closed_early.set()


def test_tokens_reach_the_client_before_the_engine_finishes(gateway, scripted):
    from openai import OpenAI

    # the engine holds its last token until the client has seen the first text (a buffering gateway never
    # shows it early: the engine then finishes after 60 s, before the client sees anything, and this fails)
    client_saw_text = threading.Event()
    engine = Tracked(scripted(lambda req, i: "one two three four five six seven eight nine ten", token_delay_s=0.05),
                     hold_last=client_saw_text)
    gw = gateway(engine)
    stream = OpenAI(base_url=f"{gw.url}/v1", api_key="x").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "count"}], stream=True)
    seen_before_end = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen_before_end.append(not engine.finished.is_set())
            client_saw_text.set()
    assert seen_before_end[0] is True and len(seen_before_end) > 3


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_in_every_provider(stream, gateway, scripted):
    import anthropic
    from google import genai
    from google.genai import types
    from openai import OpenAI

    text = "alpha beta END gamma delta"
    engine = Tracked(scripted(lambda req, i: text))
    gw = gateway(engine)
    oa = OpenAI(base_url=f"{gw.url}/s/stop/v1", api_key="x")
    msgs = [{"role": "user", "content": "go"}]
    if stream:
        chunks = list(oa.chat.completions.create(model="tiny", messages=msgs, stop=["END"], stream=True))
        chat = "".join(c.choices[0].delta.content or "" for c in chunks)
        chat_finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    else:
        r = oa.chat.completions.create(model="tiny", messages=msgs, stop=["END"])
        chat, chat_finish = r.choices[0].message.content, [r.choices[0].finish_reason]
    assert chat == "alpha beta " and chat_finish == ["stop"]
    assert engine.closed_early.is_set()  # generation was cut at the stop string, not run to the end

    ac = anthropic.Anthropic(base_url=f"{gw.url}/s/stop", api_key="x")
    if stream:
        with ac.messages.stream(model="tiny", max_tokens=50, messages=msgs, stop_sequences=["gamma"]) as s:
            msg = s.get_final_message()
    else:
        msg = ac.messages.create(model="tiny", max_tokens=50, messages=msgs, stop_sequences=["gamma"])
    assert (msg.content[0].text, msg.stop_reason, msg.stop_sequence) == ("alpha beta END ", "stop_sequence", "gamma")

    gc = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{gw.url}/s/stop", api_version="v1beta"))
    cfg = types.GenerateContentConfig(stop_sequences=["beta"])
    if stream:
        got = "".join(c.text or "" for c in gc.models.generate_content_stream(model="tiny", contents="go", config=cfg))
    else:
        got = gc.models.generate_content(model="tiny", contents="go", config=cfg).text
    assert got == "alpha "
    recs = gw.records("stop")
    assert [r.finish_reason for r in recs] == ["stop_sequence"] * 3
    assert [r.metadata["stop_sequence"] for r in recs] == ["END", "gamma", "beta"]
    tok = engine.tokenizer
    for r in recs:  # the sampled ids run through the stop string (what the policy produced), not beyond it
        decoded = tok.decode(r.sampled_ids)
        assert decoded.startswith(r.metadata["output"]["content"]) and r.metadata["stop_sequence"] in decoded


def test_multibyte_text_streams_intact(gateway, scripted):
    import anthropic

    text = "naïve café — ☃ 日本語 🙂🚀 done"
    gw = gateway(scripted(lambda req, i: text))
    with anthropic.Anthropic(base_url=gw.url, api_key="x").messages.stream(
            model="tiny", max_tokens=200, messages=[{"role": "user", "content": "go"}]) as s:
        deltas = list(s.text_stream)
    assert "".join(deltas) == text and not any("\ufffd" in d for d in deltas)


def test_client_hanging_up_mid_stream_leaves_an_incomplete_record(gateway, scripted):
    engine = Tracked(scripted(lambda req, i: "word " * 200, token_delay_s=0.02))
    gw = gateway(engine)
    body = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    with httpx.stream("POST", f"{gw.url}/s/gone/v1/chat/completions", json=body, timeout=60) as r:
        data_lines = (line for line in r.iter_lines() if line.startswith("data:"))
        next(data_lines), next(data_lines), next(data_lines)  # the role chunk and two content chunks
        # leaving the block hangs up mid-stream
    deadline = time.monotonic() + 30
    while not gw.records("gone") and time.monotonic() < deadline:
        time.sleep(0.05)
    (rec,) = gw.records("gone")
    assert not rec.complete and "disconnected" in rec.error
    assert 0 < len(rec.sampled_ids) < 200 and engine.closed_early.is_set()
    assert httpx.get(f"{gw.url}/health", timeout=60).json()["inflight"] == 0
