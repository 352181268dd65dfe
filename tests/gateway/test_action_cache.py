"""The action cache (``gateway.action_cache``, polar.inference.action_cache) behind a real gateway on 127.0.0.1,
read with the official openai SDK over the real embedded engine (the tiny model): a repeated greedy prompt
is answered from the cache with the first answer's tokens and logprobs bit for bit; a new policy version
empties it; a temperature above 0 is refused naming the key; the store is bounded; training refuses it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from polar.config.gateway import ActionCacheConfig
from polar.inference.action_cache import ActionCache, ActionCacheEngine, with_action_cache
from polar.inference.base import EngineError, GenerationRequest, TokenEvent

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Which way to the goal?"}]


def counting(engine: Any) -> list[GenerationRequest]:
    """Count the requests that reach ``engine`` itself (a hit never does)."""
    seen: list[GenerationRequest] = []
    generate = engine.generate

    def spy(request: GenerationRequest) -> Any:
        seen.append(request)
        return generate(request)

    engine.generate = spy
    return seen


def ask(gw: Any, session: str, **kwargs: Any) -> Any:
    from openai import OpenAI

    client = OpenAI(base_url=f"{gw.url}/s/{session}/v1", api_key="x", max_retries=0)
    kwargs.setdefault("max_tokens", 6)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model="tiny", messages=kwargs.pop("messages", MESSAGES), **kwargs)


def health(gw: Any) -> dict[str, Any]:
    import httpx

    return httpx.get(f"{gw.url}/health", timeout=10).json()


def test_a_repeated_greedy_prompt_is_replayed_with_the_first_answers_tokens_and_logprobs(gateway, embedded):
    calls = counting(embedded)
    gw = gateway(embedded, action_cache=ActionCacheConfig().model_dump())
    first = ask(gw, "one", logprobs=True, top_logprobs=2)
    again = ask(gw, "two", logprobs=True, top_logprobs=2)
    assert len(calls) == 1  # the second answer never reached the engine
    (a,), (b,) = gw.records("one"), gw.records("two")
    assert a.complete and b.complete
    # what a trainer would read: the same ids, the same raw logprobs (exactly), the same version
    assert b.prompt_ids == a.prompt_ids and b.sampled_ids == a.sampled_ids and len(a.sampled_ids) > 0
    assert b.logprobs == a.logprobs and b.policy_version == a.policy_version == 0
    assert again.choices[0].message.content == first.choices[0].message.content
    assert [[t.logprob for t in c.top_logprobs] for c in again.choices[0].logprobs.content] == \
           [[t.logprob for t in c.top_logprobs] for c in first.choices[0].logprobs.content]
    # anything that changes a greedy answer is part of the key: a longer answer is asked of the engine
    ask(gw, "three", max_tokens=7)
    ask(gw, "four", messages=[{"role": "user", "content": "Another question"}])
    assert len(calls) == 3
    stats = health(gw)["action_cache"]
    assert (stats["hits"], stats["misses"], stats["entries"]) == (1, 3, 3)
    assert stats["hit_rate"] == pytest.approx(0.25) and stats["bytes"] > 0


def test_the_cached_answer_is_what_the_engine_gives_without_the_cache(gateway, embedded, tiny):
    from polar.inference.embedded import EmbeddedEngine

    plain = gateway(EmbeddedEngine(*tiny, model_name="tiny"))
    cached = gateway(embedded, action_cache={"max_entries": 8})
    ask(cached, "miss")
    ask(cached, "hit")
    ask(plain, "ref")
    (ref,), (hit,) = plain.records("ref"), cached.records("hit")
    assert health(cached)["action_cache"]["hits"] == 1
    assert hit.sampled_ids == ref.sampled_ids and hit.logprobs == ref.logprobs


def test_a_new_policy_version_empties_the_cache(gateway, embedded, tiny):
    calls = counting(embedded)
    gw = gateway(embedded, action_cache={})
    ask(gw, "v0")
    ask(gw, "v0-again")
    assert len(calls) == 1
    gw.update_weights(tiny[0].state_dict(), version=1)  # the same weights, but a sync: nothing older is replayed
    ask(gw, "v1")
    assert len(calls) == 2
    (rec,) = gw.records("v1")
    assert rec.policy_version == 1
    ask(gw, "v1-again")
    assert len(calls) == 2
    # a version that arrives another way (a gateway node stamping it on the engine) empties it too
    gw.engine.policy_version = 2
    assert embedded.policy_version == 2  # set on the engine itself, not on the cache's wrapper
    ask(gw, "v2")
    assert len(calls) == 3
    stats = health(gw)["action_cache"]
    assert stats["invalidations"] == 2 and stats["policy_version"] == 2 and stats["entries"] == 1


def test_a_sampled_request_is_refused_naming_temperature(gateway, embedded):
    import openai

    calls = counting(embedded)
    gw = gateway(embedded, action_cache={})
    with pytest.raises(openai.BadRequestError) as e:
        ask(gw, "hot", temperature=0.7)
    body = e.value.body
    assert body["param"] == "temperature"
    assert "temperature is 0.7" in body["message"] and "gateway.action_cache" in body["message"]
    assert "\n" not in body["message"] and calls == []


def test_identical_requests_in_flight_wait_for_one_answer(embedded):
    calls = counting(embedded)
    engine = with_action_cache(embedded, 16, 1 << 20)
    ids = embedded.tokenizer.encode("the same prompt, asked by eight episodes at once")

    async def one() -> list[TokenEvent]:
        return [ev async for ev in engine.generate(GenerationRequest(prompt_ids=ids, max_tokens=5, temperature=0))]

    async def eight() -> list[list[TokenEvent]]:
        return await asyncio.gather(*(one() for _ in range(8)))

    answers = asyncio.run(eight())
    assert len(calls) == 1
    assert all([(e.token_id, e.logprob) for e in a] == [(e.token_id, e.logprob) for e in answers[0]] for a in answers)
    stats = engine.stats()
    assert (stats["hits"], stats["misses"], stats["waits"]) == (7, 1, 7)


def test_the_store_is_bounded_by_entries_and_bytes():
    def events(n: int) -> list[TokenEvent]:
        return [TokenEvent(i, -0.5) for i in range(n - 1)] + [TokenEvent(n, -0.5, "stop", 0)]

    def key(i: int, length: int = 4) -> tuple[Any, ...]:
        return (bytes([i]) * length, 8, (), 0)

    cache = ActionCache(max_entries=2, max_bytes=1 << 20)
    for i in range(3):
        cache.put(0, key(i), events(3))
    assert cache.get(0, key(0)) is None  # the least recently used went first
    assert cache.get(0, key(1)) is not None and cache.get(0, key(2)) is not None
    cache.put(0, key(3), events(3))  # key 1 was used before key 2: it goes
    assert cache.get(0, key(1)) is None and cache.get(0, key(2)) is not None
    assert cache.stats()["evictions"] == 2
    small = ActionCache(max_entries=100, max_bytes=1000)
    for i in range(10):
        small.put(0, key(i, 100), events(10))  # 256 + 100 + 160 bytes each: one fits
    assert small.stats()["entries"] == 1 and small.stats()["bytes"] <= 1000
    small.put(0, key(99, 2000), events(2))  # larger than the whole cache: not kept, nothing evicted for it
    assert small.get(0, key(99, 2000)) is None and small.stats()["entries"] == 1


def test_an_engine_that_answers_chat_text_is_refused():
    class TextLevel:
        text_level = True

    with pytest.raises(EngineError, match=r"openai_compat.*cannot be cached"):
        with_action_cache(TextLevel(), 4, 4096)
    assert not isinstance(TextLevel(), ActionCacheEngine)


def test_a_training_run_refuses_the_action_cache():
    from polar.config import load_config
    from polar.errors import ConfigError

    with pytest.raises((ConfigError, ValueError)) as e:
        load_config(ROOT / "examples" / "llm_frozenlake.yaml", ["gateway.action_cache.max_entries=64"])
    assert "gateway.action_cache is for serving" in str(e.value) and "polar eval" in str(e.value)
