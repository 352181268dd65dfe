"""Trajectory builders: a session's recorded calls → training sequences with a loss mask.

Both builders only ever mark tokens the policy sampled as trainable (``loss_mask == 1``, with the
logprob the engine reported); prompt, tool-result and template tokens are 0 with logprob 0.0. Calls
that are incomplete (``complete=False``: an error, a cancelled stream, an upstream without ids) or
whose capture is inconsistent (``len(logprobs) != len(sampled_ids)``) are excluded and counted.
Records of different sessions are never mixed: each session is built on its own.

Per-token side arrays (same length as ``token_ids``): ``policy_versions[i]`` is the version of the weights
that sampled token ``i`` (``CallRecord.token_versions``: a call that went on across a weight update has
tokens of two versions), or for a prompt token the version of the call that introduced it; ``call_indices[i]``
is that call's index. Trainers only need them where the mask is 1 (per-token off-policy correction).

- ``per_request``: one sample per call, ``prompt_ids + sampled_ids``. Works for any harness, including
  ones that rewrite or compact their history; costs one forward over the shared prefix per call.
- ``prefix_merging``: a call joins the open chain whose tip (previous call's ``prompt_ids + sampled_ids``)
  is a prefix of its ``prompt_ids`` (the longest such tip wins); the tail past the tip (tool results,
  template glue, new user turns) is masked, then its sampled ids are appended. Because the gateway
  re-uses the exact sampled ids in later prompts, tips are compared token for token against what the
  policy produced, with no re-tokenization drift. A call that extends no tip starts a new chain; when
  other chains exist this is a *prefix break* (the harness rewrote, compacted or retried its history)
  and is reported in the stats with how far it matched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from polar.types import CallRecord, TrajectorySample

BUILDERS = ("per_request", "prefix_merging")


@dataclass
class ReconstructionStats:
    """What a builder did with a session's calls. ``prefix_breaks`` counts calls that started a new
    chain while another chain was open; ``breaks`` says, for each, how much of the best tip matched."""

    builder: str
    calls_total: int = 0
    calls_used: int = 0
    calls_incomplete: int = 0
    calls_inconsistent: int = 0
    calls_with_tool_calls: int = 0  # of calls_total: the model's reply called a tool (the run's tool-call rate)
    samples: int = 0
    chains_merged: int = 0  # samples built from 2+ calls
    prefix_breaks: int = 0
    tokens_total: int = 0
    tokens_trainable: int = 0
    tokens_per_request: int = 0  # what per_request would have produced, for the compression ratio
    breaks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def compression(self) -> float:
        return self.tokens_per_request / self.tokens_total if self.tokens_total else 1.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["compression"] = round(self.compression, 4)
        return d


def usable_calls(records: Iterable[CallRecord], stats: ReconstructionStats) -> list[CallRecord]:
    """Complete, self-consistent calls in call order; the rest are counted in ``stats`` and dropped."""
    out = []
    for rec in sorted(records, key=lambda r: r.call_index):
        stats.calls_total += 1
        if (rec.metadata.get("output") or {}).get("tool_calls"):
            stats.calls_with_tool_calls += 1
        if not rec.complete or rec.error is not None or not rec.prompt_ids:
            stats.calls_incomplete += 1
        elif len(rec.logprobs) != len(rec.sampled_ids):
            stats.calls_inconsistent += 1
        else:
            out.append(rec)
    stats.calls_used += len(out)
    stats.tokens_per_request += sum(len(r.prompt_ids) + len(r.sampled_ids) for r in out)
    return out


def _by_session(records: Iterable[CallRecord]) -> dict[str, list[CallRecord]]:
    groups: dict[str, list[CallRecord]] = {}
    for rec in records:
        groups.setdefault(rec.session_id, []).append(rec)
    return groups


class _Chain:
    """A growing merged sequence; ``tip`` is the last call's prompt + sampled ids (== ``tokens``)."""

    def __init__(self, rec: CallRecord) -> None:
        self.tokens: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.calls: list[int] = []
        self.records: list[CallRecord] = []
        self.add(rec, 0)

    def add(self, rec: CallRecord, matched: int) -> None:
        tail = rec.prompt_ids[matched:]
        n = len(tail) + len(rec.sampled_ids)
        self.tokens += [*tail, *rec.sampled_ids]
        self.mask += [0] * len(tail) + [1] * len(rec.sampled_ids)
        self.logprobs += [0.0] * len(tail) + [float(x) for x in rec.logprobs]
        self.versions += [rec.policy_version] * len(tail) + rec.token_versions()
        self.calls += [rec.call_index] * n
        self.records.append(rec)


def _sample(session_id: str, chain: _Chain, builder: str) -> TrajectorySample:
    recs = chain.records
    first_meta = recs[0].metadata or {}
    meta = {
        "builder": builder,
        "calls": [r.call_index for r in recs],
        "finish_reasons": [r.finish_reason for r in recs],
        "providers": sorted({r.provider for r in recs}),
        "model": recs[-1].model,
        "truncated": recs[-1].finish_reason == "length",
    }
    return TrajectorySample(
        session_id=session_id,
        token_ids=chain.tokens,
        loss_mask=chain.mask,
        logprobs=chain.logprobs,
        policy_versions=chain.versions,
        call_indices=chain.calls,
        reward=first_meta.get("reward"),
        group_id=first_meta.get("group_id"),
        metadata=meta,
    )


def per_request(records: Iterable[CallRecord]) -> tuple[list[TrajectorySample], ReconstructionStats]:
    """One sample per usable call: ``prompt_ids`` masked, ``sampled_ids`` trainable."""
    stats = ReconstructionStats("per_request")
    samples: list[TrajectorySample] = []
    for session_id, recs in _by_session(records).items():
        for rec in usable_calls(recs, stats):
            samples.append(_sample(session_id, _Chain(rec), "per_request"))
    _finish_stats(stats, samples)
    return samples, stats


def prefix_merging(records: Iterable[CallRecord]) -> tuple[list[TrajectorySample], ReconstructionStats]:
    """Merge calls whose prompt extends an earlier call's prompt + sampled ids into one sequence."""
    stats = ReconstructionStats("prefix_merging")
    samples: list[TrajectorySample] = []
    for session_id, recs in _by_session(records).items():
        chains: list[_Chain] = []
        for rec in usable_calls(recs, stats):
            best: _Chain | None = None
            for chain in chains:
                if _is_prefix(chain.tokens, rec.prompt_ids) and (
                    best is None or len(chain.tokens) > len(best.tokens)
                ):
                    best = chain
            if best is not None:
                best.add(rec, len(best.tokens))
                continue
            if chains:
                stats.prefix_breaks += 1
                stats.breaks.append(_describe_break(rec, chains))
            chains.append(_Chain(rec))
        samples += [_sample(session_id, c, "prefix_merging") for c in chains]
    stats.chains_merged = sum(1 for s in samples if len(s.metadata["calls"]) > 1)
    _finish_stats(stats, samples)
    return samples, stats


def _is_prefix(tip: list[int], prompt: list[int]) -> bool:
    return len(tip) <= len(prompt) and prompt[: len(tip)] == tip


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _describe_break(rec: CallRecord, chains: list[_Chain]) -> dict[str, Any]:
    scored = [(_common_prefix(c.tokens, rec.prompt_ids), c) for c in chains]
    matched, chain = max(scored, key=lambda x: x[0])
    return {
        "call_index": rec.call_index,
        "closest_chain_last_call": chain.records[-1].call_index,
        "common_prefix_tokens": matched,
        "tip_tokens": len(chain.tokens),
        "prompt_tokens": len(rec.prompt_ids),
    }


def _finish_stats(stats: ReconstructionStats, samples: list[TrajectorySample]) -> None:
    stats.samples = len(samples)
    stats.tokens_total = sum(len(s.token_ids) for s in samples)
    stats.tokens_trainable = sum(sum(s.loss_mask) for s in samples)


def build(
    records: Iterable[CallRecord], builder: str = "prefix_merging"
) -> tuple[list[TrajectorySample], dict[str, Any]]:
    """Run the named builder; returns the samples and its stats as a JSON-ready dict."""
    fns = {"per_request": per_request, "prefix_merging": prefix_merging}
    if builder not in fns:
        from polar.config.base import did_you_mean
        from polar.errors import ConfigError

        raise ConfigError(
            f"unknown trajectory builder '{builder}'{did_you_mean(builder, set(fns))}; use one of {', '.join(BUILDERS)}"
        )
    samples, stats = fns[builder](records)
    return samples, stats.to_dict()
