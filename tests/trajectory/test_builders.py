"""Trajectory builders on hand-made records: masks, chaining, prefix breaks, exclusions, Parquet."""

from __future__ import annotations

import pytest

from polar.errors import ConfigError, PolarError
from polar.trajectory import (
    build,
    from_arrow,
    per_request,
    prefix_merging,
    read_parquet,
    to_arrow,
    write_parquet,
)
from polar.types import CallRecord


def rec(i, prompt, sampled, session="s1", version=0, **kw):
    logprobs = kw.pop("logprobs", [-0.25 - 0.01 * k for k in range(len(sampled))])
    return CallRecord(
        session_id=session,
        call_index=i,
        provider="openai_chat",
        model="m",
        messages=[],
        prompt_ids=prompt,
        sampled_ids=sampled,
        logprobs=logprobs,
        finish_reason="stop",
        policy_version=version,
        started_at=0.0,
        ended_at=1.0,
        **kw,
    )


def test_per_request_masks_prompts_and_keeps_sampled_logprobs():
    samples, stats = per_request([rec(1, [1, 2, 3, 4, 5, 6], [7], version=2), rec(0, [1, 2, 3], [4, 5])])
    assert [s.metadata["calls"] for s in samples] == [[0], [1]]  # call order, not arrival order
    first = samples[0]
    assert first.token_ids == [1, 2, 3, 4, 5] and first.loss_mask == [0, 0, 0, 1, 1]
    assert first.logprobs == [0.0, 0.0, 0.0, -0.25, -0.26]
    assert samples[1].policy_versions == [2] * 7 and samples[1].call_indices == [1] * 7
    assert stats.samples == 2 and stats.tokens_trainable == 3 and stats.prefix_breaks == 0


def test_prefix_merging_chains_masks_interstitials_and_counts_breaks():
    records = [
        rec(0, [1, 2, 3], [4, 5]),
        rec(1, [1, 2, 3, 4, 5, 6, 7], [8], version=1),  # extends call 0: 6, 7 are tool/template tokens
        rec(2, [1, 2, 9], [10]),  # history rewritten: a prefix break
        rec(3, [1, 2, 3, 4, 5, 6, 7, 8, 11], [12], version=1),  # continues the first chain
        rec(4, [1, 2, 9, 10], [13]),  # prompt == tip of the second chain: still a continuation
        rec(5, [1], [2], complete=False, error="upstream 500"),
        rec(6, [1, 2], [3, 4], logprobs=[-1.0]),  # inconsistent capture
    ]
    samples, stats = prefix_merging(records)
    assert len(samples) == 2
    a, b = samples
    assert a.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 11, 12]
    assert a.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1]
    assert a.logprobs == [0.0, 0.0, 0.0, -0.25, -0.26, 0.0, 0.0, -0.25, 0.0, -0.25]
    assert a.call_indices == [0, 0, 0, 0, 0, 1, 1, 1, 3, 3] and a.policy_versions == [0] * 5 + [1] * 5
    assert a.metadata["calls"] == [0, 1, 3]
    assert b.token_ids == [1, 2, 9, 10, 13] and b.loss_mask == [0, 0, 0, 1, 1]
    assert stats.prefix_breaks == 1 and stats.breaks[0]["call_index"] == 2
    assert stats.breaks[0]["common_prefix_tokens"] == 2
    assert stats.calls_total == 7 and stats.calls_used == 5
    assert stats.calls_incomplete == 1 and stats.calls_inconsistent == 1
    assert stats.chains_merged == 2 and stats.tokens_trainable == 6
    assert stats.compression > 1.0


def test_longest_matching_tip_wins_and_sessions_never_mix():
    records = [
        rec(0, [1, 2], [3]),
        rec(1, [1, 2, 3, 4], [5]),
        rec(2, [1, 2], [3], session="s2"),  # same ids, other session: its own chain
        rec(3, [1, 2, 3, 4, 5, 6], [7]),
    ]
    samples, stats = prefix_merging(records)
    by_session = {}
    for s in samples:
        by_session.setdefault(s.session_id, []).append(s)
    assert [s.metadata["calls"] for s in by_session["s1"]] == [[0, 1, 3]]
    assert [s.metadata["calls"] for s in by_session["s2"]] == [[2]]
    assert stats.prefix_breaks == 0


def test_build_returns_json_stats_and_rejects_unknown_builders():
    _samples, stats = build([rec(0, [1], [2])], "per_request")
    assert stats["builder"] == "per_request" and stats["samples"] == 1 and "compression" in stats
    with pytest.raises(ConfigError, match="did you mean: prefix_merging"):
        build([], "prefix_merge")


def test_parquet_round_trip_is_exact(tmp_path):
    samples, _ = prefix_merging(
        [
            rec(0, [1, 2, 3], [4, 5], metadata={"group_id": "g1", "reward": 1.0}),
            rec(1, [1, 2, 3, 4, 5, 6], [7]),
        ]
    )
    samples[0].logprobs[-1] = -1.2345678901234567
    path = write_parquet(samples, tmp_path / "out" / "traj.parquet")
    back = read_parquet(path)
    assert [s.to_dict() for s in back] == [s.to_dict() for s in samples]
    assert back[0].group_id == "g1" and back[0].reward == 1.0
    assert from_arrow(to_arrow(samples))[0].logprobs[-1] == -1.2345678901234567
    with pytest.raises(PolarError, match="missing columns"):
        from_arrow(to_arrow(samples).drop_columns(["loss_mask"]))
    samples[0].loss_mask.append(1)
    with pytest.raises(PolarError, match="loss_mask has"):
        to_arrow(samples)
