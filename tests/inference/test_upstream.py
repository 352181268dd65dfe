"""Upstream engines against stand-ins that follow vLLM's and SGLang's documented HTTP APIs.

vLLM/SGLang need a GPU, so the servers are stand-ins (polar.testing.standin); everything else is real:
HTTP on 127.0.0.1, SSE streaming, and the official openai SDK checking the vLLM stand-in's shape.
"""

from __future__ import annotations

import asyncio

import pytest

from polar.inference import (
    ContextLengthExceeded,
    EngineError,
    GenerationRequest,
    UpstreamUnavailable,
    collect,
    load_engine,
)
from polar.inference.embedded import sequence_logprobs
from polar.testing.standin import FixedEngine, StandinServer, make_app

from .conftest import chat_prompt


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


@pytest.mark.parametrize(
    ("api", "incremental"),
    [("vllm", False), ("sglang", False), ("sglang", True)],
    ids=["vllm", "sglang", "sglang-incremental"],
)
def test_upstream_returns_the_servers_exact_ids_and_logprobs(engine, api, incremental):
    with StandinServer(make_app(engine, api, incremental=incremental)) as server:
        up = load_engine(f"{api}:{server.url}")
        prompt = chat_prompt(up.tokenizer, "hi upstream")

        async def go():
            events = [
                e
                async for e in up.generate(GenerationRequest(prompt, max_tokens=7, seed=11, temperature=0.9))
            ]
            direct = await collect(
                engine.generate(GenerationRequest(prompt, max_tokens=7, seed=11, temperature=0.9))
            )
            await up.close()
            return events, direct

        events, direct = run(go())
        body = server.requests[-1]["body"]
    ids = [e.token_id for e in events if e.token_id is not None]
    assert ids == direct.token_ids and len(ids) == 7
    assert events[-1].finish_reason == "length" and events[-1].policy_version == 0
    lps = [e.logprob for e in events if e.token_id is not None]
    ref = sequence_logprobs(engine.model, prompt + ids)[len(prompt) - 1 :]
    assert max(abs(a - b) for a, b in zip(ref, lps, strict=False)) < 1e-4
    if api == "vllm":  # token-id prompt, ids and logprobs requested, streamed
        assert body["prompt"] == prompt and body["return_token_ids"] is True and body["logprobs"] == 0
        assert body["stream"] is True and body["model"] == "tiny" and body["seed"] == 11
    else:
        assert body["input_ids"] == prompt and body["return_logprob"] is True
        assert (
            body["sampling_params"]["max_new_tokens"] == 7 and body["sampling_params"]["sampling_seed"] == 11
        )


def test_vllm_standin_matches_the_openai_sdk_completions_shape(engine):
    from openai import OpenAI

    with StandinServer(make_app(engine, "vllm")) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
        prompt = chat_prompt(engine.tokenizer, "sdk check")
        done = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=5,
            temperature=0,
            logprobs=1,
            extra_body={"return_token_ids": True, "stop_token_ids": []},
        )
        choice = done.choices[0]
        assert choice.prompt_token_ids == prompt and len(choice.token_ids) == 5
        assert len(choice.logprobs.token_logprobs) == 5 and choice.finish_reason == "length"
        assert done.usage.completion_tokens == 5
        streamed = []
        for chunk in client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=5,
            temperature=0,
            stream=True,
            extra_body={"return_token_ids": True},
        ):
            streamed += chunk.choices[0].token_ids
        assert streamed == choice.token_ids
        with pytest.raises(Exception, match="does not exist"):
            client.completions.create(model="other", prompt=prompt, max_tokens=1)


def test_sessions_stick_to_one_replica_and_fail_over_when_it_dies():
    fixed = FixedEngine(n_tokens=3)
    a = StandinServer(make_app(fixed, "vllm", name="a")).start()
    b = StandinServer(make_app(fixed, "vllm", name="b")).start()
    try:
        up = load_engine({"kind": "vllm", "urls": [a.url, b.url], "served_model": "tiny", "cooldown_s": 60})
        sessions = [f"session-{i}" for i in range(16)]

        def prompt_of(sid):  # a distinct prompt per session, so the servers' logs say who served whom
            return [1, 2, 3 + int(sid.split("-")[1])]

        async def round_(sids):
            for sid in sids:
                result = await collect(
                    up.generate(GenerationRequest(prompt_of(sid), max_tokens=3, session_id=sid))
                )
                assert result.token_ids == fixed.token_ids[:3]

        run(round_(sessions * 3))
        served_by = {}
        for server in (a, b):
            for r in server.requests:
                served_by.setdefault(r["body"]["prompt"][-1], set()).add(server.url)
        # each session's 3 calls went to one replica, and both replicas got sessions
        assert all(len(urls) == 1 for urls in served_by.values()) and len(served_by) == len(sessions)
        replica_of = {sid: next(iter(served_by[prompt_of(sid)[-1]])) for sid in sessions}
        assert set(replica_of.values()) == {a.url, b.url}
        assert len(a.requests) + len(b.requests) == 3 * len(sessions)

        a.stop()
        moved = [sid for sid, url in replica_of.items() if url == a.url]
        before_b = len(b.requests)
        run(round_(moved))  # the first one fails over (a is marked down), the rest route to b directly
        assert len(b.requests) == before_b + len(moved)
        assert all(up.route(sid)[0].url == b.url for sid in sessions)
        # sessions that were on b never moved
        assert all(replica_of[sid] == b.url for sid in sessions if sid not in moved)

        b.stop()
        with pytest.raises(UpstreamUnavailable, match="no vllm replica could serve"):
            run(collect(up.generate(GenerationRequest([1, 2, 3], max_tokens=3, session_id="x"))))
        run(up.close())
    finally:
        a.stop()
        b.stop()


def test_upstream_errors_are_clear(engine):
    with StandinServer(make_app(engine, "vllm", max_model_len=64)) as server:
        up = load_engine({"kind": "vllm", "urls": [server.url], "context_length": 64})
        with pytest.raises(ContextLengthExceeded):  # caught before any HTTP call
            run(collect(up.generate(GenerationRequest([5] * 64, max_tokens=1))))
        assert server.requests == []
        wrong = load_engine({"kind": "vllm", "urls": [server.url], "served_model": "other"})
        with pytest.raises(EngineError, match="rejected the request \\(HTTP 404\\)"):
            run(collect(wrong.generate(GenerationRequest([5, 6], max_tokens=1))))
        with pytest.raises(EngineError, match="cannot be synced: the engine has no local model folder"):
            run(up.update_weights({"w": 1}, version=2))
        run(up.update_weights({}, version=2))
        assert up.policy_version == 2
    with pytest.raises(EngineError, match="needs one or more http"):
        load_engine("vllm:localhost:8000")
    from polar.errors import ConfigError

    with pytest.raises(ConfigError, match="urls"):
        load_engine({"kind": "vllm", "url": ["http://x"]})


class _DiesMidStream(FixedEngine):
    """Streams two tokens, then the server process 'crashes' (the connection drops)."""

    async def generate(self, request):
        n = 0
        async for ev in super().generate(request):
            if n == 2:
                raise RuntimeError("replica crashed")
            n += 1
            yield ev


def test_a_replica_dying_mid_stream_ends_the_stream_with_abort_not_a_hang():
    with StandinServer(make_app(_DiesMidStream(n_tokens=8), "sglang")) as server:
        up = load_engine(f"sglang:{server.url}")

        async def go():
            events = [e async for e in up.generate(GenerationRequest([1, 2, 3], max_tokens=8))]
            await up.close()
            return events

        events = run(go())
    assert [e.token_id for e in events[:2]] == FixedEngine(8).token_ids[:2]
    assert events[-1].finish_reason == "abort" and events[-1].token_id is None


@pytest.mark.parametrize(
    ("api", "incremental"),
    [("vllm", False), ("sglang", False), ("sglang", True)],
    ids=["vllm", "sglang", "sglang-incremental"],
)
def test_non_streamed_upstream_call_gives_the_same_events_and_fails_over(engine, api, incremental):
    """``stream=False`` makes one non-streamed upstream request; its events equal the streamed ones."""
    with StandinServer(make_app(engine, api, incremental=incremental)) as server:
        up = load_engine(f"{api}:http://127.0.0.1:1,{server.url}")  # first replica is dead: fail over
        prompt = chat_prompt(up.tokenizer, "non-streamed")

        async def gen(stream: bool):
            req = GenerationRequest(prompt, max_tokens=6, seed=5, temperature=0.8, stream=stream)
            return [(e.token_id, e.logprob, e.finish_reason, e.policy_version) async for e in up.generate(req)]

        async def go():
            streamed, plain = await gen(True), await gen(False)
            await up.close()
            return streamed, plain

        streamed, plain = run(go())
        bodies = [r["body"] for r in server.requests]
    assert plain == streamed
    assert len([e for e in plain if e[0] is not None]) == 6 and plain[-1][2] == "length"
    assert bodies[-1]["stream"] is False and bodies[-2]["stream"] is True


def test_non_streamed_call_maps_context_length_and_dead_upstreams(engine):
    with StandinServer(make_app(engine, "vllm")) as server:
        up = load_engine(f"vllm:{server.url}")
        too_long = [5] * (up.context_length + 10)

        async def go():
            try:
                with pytest.raises(ContextLengthExceeded):
                    await collect(up.generate(GenerationRequest(too_long, max_tokens=4, stream=False)))
            finally:
                await up.close()

        run(go())
