"""A non-streamed call through a vLLM upstream takes the answer whole (``Engine.generate_whole``): one
JSON body, no event per token. Its record must be the record the per-token path writes, and an engine
wrapper (the action cache) must still see every call. Real HTTP: the vLLM stand-in on 127.0.0.1 serving
the tiny model, the gateway on its own port."""

from __future__ import annotations

from typing import Any

import httpx

from polar.inference.upstream import UpstreamConfig, UpstreamEngine
from polar.testing.standin import StandinServer, make_app


def _upstream(url: str) -> UpstreamEngine:
    return UpstreamEngine(UpstreamConfig(kind="vllm", urls=[url], served_model="tiny"))


def _chat(gw: Any, session: str, stream: bool, **extra: Any) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count to five"}], "max_tokens": 12,
            "seed": 3, "temperature": 1.0, "stream": stream, **extra}
    return httpx.post(f"{gw.url}/s/{session}/v1/chat/completions", json=body, timeout=60)


def _spy(engine: UpstreamEngine, name: str, seen: list[str]) -> None:
    method = getattr(engine, name)

    def spied(*args: Any, **kwargs: Any) -> Any:
        seen.append(name)
        return method(*args, **kwargs)

    setattr(engine, name, spied)


def test_a_non_streamed_call_takes_the_answer_whole_and_records_what_the_events_would(gateway, embedded):
    with StandinServer(make_app(embedded, "vllm")) as live:
        up = _upstream(live.url)
        seen: list[str] = []
        _spy(up, "generate", seen)
        _spy(up, "generate_whole", seen)
        gw = gateway(up)
        whole = _chat(gw, "whole", stream=False)
        assert whole.status_code == 200, whole.text
        assert seen == ["generate_whole"]  # no per-token events for a call that shows nothing before the end
        # the same call where tokens must be watched (a stop string that never matches): the per-token path
        seen.clear()
        events = _chat(gw, "events", stream=False, stop=["@@never@@"])
        assert events.status_code == 200 and seen == ["generate"]
        streamed = _chat(gw, "streamed", stream=True)
        assert streamed.status_code == 200
        (a,), (b,), (c,) = gw.records("whole"), gw.records("events"), gw.records("streamed")
    assert live.requests[-3]["body"]["stream"] is False
    assert a.sampled_ids == b.sampled_ids == c.sampled_ids and len(a.sampled_ids) > 0  # seed 3: one sample
    assert a.logprobs == b.logprobs and max(abs(x - y) for x, y in zip(a.logprobs, c.logprobs, strict=True)) < 1e-6
    assert a.prompt_ids == b.prompt_ids == c.prompt_ids
    assert (a.finish_reason, a.policy_version, a.sampled_versions, a.complete) == (
        b.finish_reason, b.policy_version, b.sampled_versions, b.complete)
    assert a.complete and a.error is None and a.metadata["timings"]["ttft_s"] is not None
    assert whole.json()["choices"][0]["message"]["content"] == events.json()["choices"][0]["message"]["content"]
    assert whole.json()["usage"]["completion_tokens"] == len(a.sampled_ids)


def test_the_action_cache_still_answers_a_wrapped_upstreams_non_streamed_calls(gateway, embedded):
    """The action cache delegates attributes to the engine it wraps: a call must never reach the upstream
    past it (a repeat is replayed, a temperature above 0 refused)."""
    with StandinServer(make_app(embedded, "vllm")) as live:
        gw = gateway(_upstream(live.url), action_cache={"max_entries": 8})
        first = _chat(gw, "cached", stream=False, temperature=0.0)
        sent = len(live.requests)
        again = _chat(gw, "cached", stream=False, temperature=0.0)
        refused = _chat(gw, "cached", stream=False, temperature=0.7)
        assert len(live.requests) == sent  # the repeat never reached the upstream
        r1, r2 = gw.records("cached")[:2]
    assert first.status_code == again.status_code == 200
    assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert r2.sampled_ids == r1.sampled_ids and r2.logprobs == r1.logprobs
    assert refused.status_code == 400 and "action cache" in refused.json()["error"]["message"]
