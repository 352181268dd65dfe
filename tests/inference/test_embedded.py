"""The embedded engine: streaming, sampling controls, batching, exact logprobs, weight swaps."""

from __future__ import annotations

import asyncio

import pytest
import torch

from polar.inference import ContextLengthExceeded, EngineError, GenerationRequest, collect
from polar.inference.embedded import EmbeddedEngine, sequence_logprobs

from .conftest import chat_prompt


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def max_err(model, prompt, result):
    ref = sequence_logprobs(model, prompt + result.token_ids)[len(prompt) - 1 :]
    assert len(ref) == len(result.logprobs)
    return max(abs(a - b) for a, b in zip(ref, result.logprobs, strict=False))


def test_streams_one_event_per_token_with_raw_model_logprobs(engine):
    prompt = chat_prompt(engine.tokenizer, "hello there")

    async def go():
        events = [
            ev
            async for ev in engine.generate(
                GenerationRequest(prompt, max_tokens=9, temperature=0.7, top_p=0.9, seed=1)
            )
        ]
        return events

    events = run(go())
    assert len(events) == 9
    # every event carries the version of the weights that sampled its token (partial rollouts read it per token)
    assert all(ev.finish_reason is None and ev.policy_version == 0 for ev in events[:-1])
    assert events[-1].finish_reason == "length" and events[-1].policy_version == 0
    result = run(
        collect(engine.generate(GenerationRequest(prompt, max_tokens=9, temperature=0.7, top_p=0.9, seed=1)))
    )
    assert result.token_ids == [ev.token_id for ev in events]  # same seed, same tokens
    # logprobs are of the raw (temperature 1) model distribution, not the tempered one
    assert max_err(engine.model, prompt, result) < 1e-4


def test_greedy_top_p_and_stop_tokens(engine):
    prompt = chat_prompt(engine.tokenizer, "count to three")
    greedy = run(collect(engine.generate(GenerationRequest(prompt, max_tokens=5, temperature=0))))
    with torch.no_grad():
        expected = int(engine.model(torch.tensor([prompt])).logits[0, -1].argmax())
    assert greedy.token_ids[0] == expected
    # a tiny nucleus keeps only the top token: sampling at any temperature equals greedy
    nucleus = run(
        collect(engine.generate(GenerationRequest(prompt, max_tokens=5, temperature=1.5, top_p=1e-6, seed=3)))
    )
    assert nucleus.token_ids == greedy.token_ids
    # stopping on the third greedy token: the stop token is included and ends the stream
    stop_id = greedy.token_ids[2]
    first = greedy.token_ids.index(stop_id)
    stopped = run(
        collect(
            engine.generate(GenerationRequest(prompt, max_tokens=5, temperature=0, stop_token_ids=[stop_id]))
        )
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == greedy.token_ids[: first + 1]


def test_concurrent_requests_batch_to_the_same_result_as_sequential(engine):
    tok = engine.tokenizer
    prompts = [chat_prompt(tok, "word " * (3 * i + 1)) for i in range(5)]

    def reqs():
        return [
            GenerationRequest(
                p,
                max_tokens=6 + 4 * i,
                temperature=1.0,
                seed=100 + i,
                stop_token_ids=engine.default_stop_token_ids,
            )
            for i, p in enumerate(prompts)
        ]

    async def sequential():
        return [await collect(engine.generate(r)) for r in reqs()]

    async def concurrent():
        return await asyncio.gather(*(collect(engine.generate(r)) for r in reqs()))

    async def queued_together():
        # holding the engine's (re-entrant) condition keeps its worker from admitting any request until
        # all five are queued, so they are prefilled in one right-padded batch
        with engine._cv:
            tasks = [asyncio.create_task(collect(engine.generate(r))) for r in reqs()]
            await asyncio.sleep(0.05)
        return await asyncio.gather(*tasks)

    seq = run(sequential())
    before = engine.stats.copy()
    together = run(queued_together())
    assert engine.stats["prefill_forwards"] - before["prefill_forwards"] == 1
    assert engine.stats["prefill_sequences"] - before["prefill_sequences"] == 5
    con = run(concurrent())
    for a, b in zip(seq, together, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    for p, a, b in zip(prompts, seq, con, strict=False):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=False)) < 1e-4
        assert max_err(engine.model, p, b) < 1e-4


def test_cancelled_stream_frees_its_slot_and_engine_keeps_serving(engine):
    prompt = chat_prompt(engine.tokenizer, "a long answer please")

    async def go():
        stream = engine.generate(GenerationRequest(prompt, max_tokens=500, seed=0))
        got = [await stream.__anext__() for _ in range(3)]
        await stream.aclose()
        after = await collect(engine.generate(GenerationRequest(prompt, max_tokens=4, seed=0)))
        return got, after

    got, after = run(go())
    assert len(got) == 3 and len(after.token_ids) == 4 and after.token_ids[:3] == [e.token_id for e in got]


def test_bad_requests_fail_before_the_first_event_with_clear_errors(engine):
    n_ctx = engine.context_length
    with pytest.raises(ContextLengthExceeded, match=f"context window is {n_ctx} tokens") as info:
        run(collect(engine.generate(GenerationRequest([5] * n_ctx, max_tokens=1))))
    assert info.value.prompt_tokens == n_ctx
    with pytest.raises(EngineError, match="prompt_ids is empty"):
        run(collect(engine.generate(GenerationRequest([], max_tokens=1))))
    with pytest.raises(EngineError, match="outside the vocabulary"):
        run(collect(engine.generate(GenerationRequest([1, 10**6], max_tokens=1))))
    with pytest.raises(EngineError, match="temperature must be a number"):
        run(collect(engine.generate(GenerationRequest([1, 2], temperature=None))))
    with pytest.raises(EngineError, match="top_p"):
        run(collect(engine.generate(GenerationRequest([1, 2], top_p=0.0))))
    # max_tokens is clamped to the room left in the context window
    clamped = run(collect(engine.generate(GenerationRequest([5] * (n_ctx - 2), max_tokens=50, seed=0))))
    assert len(clamped.token_ids) == 2 and clamped.finish_reason == "length"


def test_update_weights_swaps_in_place_bumps_version_and_aborts_in_flight(tiny_pair):
    from polar.inference.tiny import build_tiny

    model, tok = build_tiny(0)  # own copy: this test changes weights
    engine = EmbeddedEngine(model, tok, model_name="tiny")
    prompt = chat_prompt(tok, "hello")
    new_weights, _ = build_tiny(7)

    async def go():
        before = await collect(engine.generate(GenerationRequest(prompt, max_tokens=8, temperature=0)))
        stream = engine.generate(GenerationRequest(prompt, max_tokens=3000, seed=1))
        first = await stream.__anext__()
        await engine.update_weights(new_weights.state_dict(), version=3)
        rest = [ev async for ev in stream]
        after = await collect(engine.generate(GenerationRequest(prompt, max_tokens=8, temperature=0)))
        with pytest.raises(EngineError, match="unknown parameter names"):
            await engine.update_weights({"nope.weight": torch.zeros(1)}, version=4)
        with pytest.raises(EngineError, match="has shape"):
            await engine.update_weights({"lm_head.weight": torch.zeros(2, 2)}, version=4)
        await engine.close()
        return before, first, rest, after

    before, first, rest, after = run(go())
    assert first.finish_reason is None
    assert rest[-1].finish_reason == "abort" and rest[-1].token_id is None and rest[-1].policy_version == 0
    assert len(rest) < 3000
    assert engine.policy_version == 3 and after.policy_version == 3 and before.policy_version == 0
    assert torch.equal(model.lm_head.weight, new_weights.lm_head.weight)  # the failed updates wrote nothing
    assert after.token_ids != before.token_ids
    assert max_err(new_weights, prompt, after) < 1e-4


def test_unbatched_decoding_gives_the_same_tokens(tiny_pair, engine):
    """The per-sequence path (used for caches that cannot be merged, e.g. linear attention) agrees."""
    solo = EmbeddedEngine(tiny_pair[0], tiny_pair[1], model_name="tiny", batch_decode=False)
    prompts = [chat_prompt(engine.tokenizer, "x " * (i + 1)) for i in range(3)]

    async def both(eng):
        return await asyncio.gather(
            *(
                collect(eng.generate(GenerationRequest(p, max_tokens=6, seed=i)))
                for i, p in enumerate(prompts)
            )
        )

    batched, unbatched = run(both(engine)), run(both(solo))
    run(solo.close())
    for p, a, b in zip(prompts, batched, unbatched, strict=True):
        assert a.token_ids == b.token_ids
        assert max_err(engine.model, p, b) < 1e-4


def test_sampler_follows_the_tempered_nucleus_distribution():
    from polar.inference.embedded import sample_rows

    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    g = torch.Generator().manual_seed(0)
    n = 4000

    def freqs(temperature, top_p):
        rows = logits.expand(n, 4).contiguous()
        ids, lps = sample_rows(rows, [temperature] * n, [top_p] * n, [g] * n)
        raw = torch.log_softmax(logits, -1)
        assert all(abs(lp - float(raw[i])) < 1e-6 for i, lp in zip(ids, lps, strict=True))
        return torch.bincount(torch.tensor(ids), minlength=4).float() / n

    expected = torch.softmax(logits / 0.7, -1)
    assert torch.allclose(freqs(0.7, 1.0), expected, atol=0.03)
    nucleus = freqs(1.0, 0.8)  # the top two tokens hold 0.83 of the mass: only they survive
    p = torch.softmax(logits, -1)[:2]
    assert nucleus[2:].sum() == 0 and torch.allclose(nucleus[:2], p / p.sum(), atol=0.03)
    assert freqs(0.0, 1.0)[0] == 1.0  # greedy


def test_session_prefix_cache_reuses_kv_and_changes_nothing(tiny_pair):
    """Turn 2 extends turn 1's prompt + sampled ids: its prefill reuses turn 1's keys/values."""
    model, tok = tiny_pair
    cached = EmbeddedEngine(model, tok, model_name="tiny")
    plain = EmbeddedEngine(model, tok, model_name="tiny", prefix_cache_tokens=0)
    glue = tok.encode(
        "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )

    async def session(eng, sid):
        prompt = chat_prompt(tok, "first turn")
        out = []
        for turn in range(3):
            r = await collect(
                eng.generate(GenerationRequest(prompt, max_tokens=5, seed=turn, session_id=sid))
            )
            out.append((prompt, r))
            prompt = prompt + r.token_ids + glue
        return out

    with_cache = run(session(cached, "s1"))
    without = run(session(plain, "s1"))
    assert cached.prefix_cache.hits == 2 and plain.prefix_cache.hits == 0
    assert cached.prefix_cache.tokens_reused > 0
    for (prompt, a), (_, b) in zip(with_cache, without, strict=True):
        assert a.token_ids == b.token_ids
        assert max_err(model, prompt, a) < 1e-4
    # another session with the same text shares nothing; weights changing clears the cache
    run(session(cached, "s2"))
    assert cached.prefix_cache.hits == 4
    run(cached.update_weights({}, version=1))
    assert len(cached.prefix_cache) == 0
    run(cached.close())
    run(plain.close())


def test_a_failing_prefill_fails_only_its_own_request(tiny_pair):
    class Flaky(EmbeddedEngine):
        def _prefill(self, seq, hit):
            if 7 in seq.request.prompt_ids:
                raise RuntimeError("out of memory (simulated)")
            return super()._prefill(seq, hit)

    eng = Flaky(tiny_pair[0], tiny_pair[1], model_name="tiny", batch_decode=True)
    eng._batch_prefill_ok = False  # one prefill per request, so the failure is isolated per request

    async def go():
        good = asyncio.create_task(collect(eng.generate(GenerationRequest([1, 2, 3], max_tokens=20, seed=0))))
        with pytest.raises(EngineError, match="out of memory"):
            await collect(eng.generate(GenerationRequest([1, 7, 3], max_tokens=5)))
        result = await good
        await eng.close()
        return result

    assert len(run(go()).token_ids) == 20
