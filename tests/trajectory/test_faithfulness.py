"""Token faithfulness: logprobs recorded during a multi-turn session equal a fresh forward pass over the
built sequences (same weights) within 1e-4, for both builders, also after a Parquet round trip.

Calls go straight to the engines (the gateway tests check the same through HTTP). Later prompts reuse
the exact sampled ids of earlier turns, as the gateway does, plus template glue for tool results.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from polar.inference import GenerationRequest, collect
from polar.inference.embedded import EmbeddedEngine, sequence_logprobs
from polar.inference.scripted import ScriptedEngine
from polar.trajectory import per_request, prefix_merging, read_parquet, write_parquet
from polar.types import CallRecord

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


@pytest.fixture(scope="module")
def tiny_pair():
    from polar.inference.tiny import build_tiny

    return build_tiny(0)


async def run_session(tiny_pair) -> list[CallRecord]:
    model, tok = tiny_pair
    sampler = EmbeddedEngine(model, tok, model_name="tiny")
    scripted = ScriptedEngine(
        tok, ['<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'], model=model
    )
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    records: list[CallRecord] = []

    async def call(engine, prompt, seed, **kw):
        req = GenerationRequest(
            prompt,
            max_tokens=10,
            temperature=0.8,
            top_p=0.95,
            seed=seed,
            stop_token_ids=sampler.default_stop_token_ids,
            session_id="s1",
        )
        result = await collect(engine.generate(req))
        records.append(
            CallRecord(
                session_id="s1",
                call_index=len(records),
                provider="openai_chat",
                model="tiny",
                messages=[],
                prompt_ids=list(prompt),
                sampled_ids=result.token_ids,
                logprobs=result.logprobs,
                finish_reason=result.finish_reason,
                policy_version=result.policy_version or 0,
                started_at=time.time(),
                ended_at=time.time(),
                **kw,
            )
        )
        return prompt + result.token_ids

    def glue(history, text):
        """Close the assistant turn if it was truncated, then add the next turn's template text."""
        closing = [] if history[-1] == im_end else [im_end]
        return history + closing + tok.encode(text, add_special_tokens=False)

    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "add 2 and 3"}], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    history = await call(scripted, tok.encode(rendered, add_special_tokens=False), seed=0)  # a tool call
    history = await call(
        sampler,
        glue(
            history,
            "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        ),
        seed=1,
    )
    history = await call(
        sampler, glue(history, "\n<|im_start|>user\nand now?<|im_end|>\n<|im_start|>assistant\n"), seed=2
    )
    records.append(
        CallRecord(  # a failed call in between: excluded from both builders
            session_id="s1",
            call_index=len(records),
            provider="openai_chat",
            model="tiny",
            messages=[],
            prompt_ids=history,
            sampled_ids=[],
            logprobs=[],
            finish_reason="abort",
            policy_version=0,
            started_at=0.0,
            ended_at=0.0,
            error="client disconnected",
            complete=False,
        )
    )
    # the harness compacts its history: a prefix break, then the new chain continues
    compact = tok.apply_chat_template(
        [{"role": "user", "content": "summary: 2 + 3 = 5. continue"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    history = await call(sampler, tok.encode(compact, add_special_tokens=False), seed=3)
    await call(sampler, glue(history, "\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"), seed=4)
    await sampler.close()
    return records


def assert_faithful(model, samples):
    checked = 0
    for s in samples:
        ref = sequence_logprobs(model, s.token_ids)
        for i, (m, lp) in enumerate(zip(s.loss_mask, s.logprobs, strict=False)):
            if m:
                assert i > 0 and abs(ref[i - 1] - lp) < 1e-4, (s.metadata["calls"], i, ref[i - 1], lp)
                checked += 1
            else:
                assert lp == 0.0
    return checked


def test_recorded_logprobs_match_a_forward_pass_for_both_builders(tiny_pair, tmp_path):
    model, _ = tiny_pair
    records = asyncio.run(asyncio.wait_for(run_session(tiny_pair), timeout=120))
    complete = [r for r in records if r.complete]
    n_sampled = sum(len(r.sampled_ids) for r in complete)

    pr, pr_stats = per_request(records)
    assert len(pr) == 5 and pr_stats.calls_incomplete == 1
    assert assert_faithful(model, pr) == n_sampled

    pm, pm_stats = prefix_merging(records)
    assert [s.metadata["calls"] for s in pm] == [[0, 1, 2], [4, 5]]
    assert pm_stats.prefix_breaks == 1 and pm_stats.breaks[0]["call_index"] == 4
    for s in pm:  # a chain is exactly its last call's prompt + sampled ids
        last = records[s.metadata["calls"][-1]]
        assert s.token_ids == last.prompt_ids + last.sampled_ids
    assert assert_faithful(model, pm) == n_sampled
    assert pm_stats.tokens_total < pr_stats.tokens_total

    for name, samples in (("per_request", pr), ("prefix_merging", pm)):
        back = read_parquet(write_parquet(samples, tmp_path / f"{name}.parquet"))
        assert assert_faithful(model, back) == n_sampled
