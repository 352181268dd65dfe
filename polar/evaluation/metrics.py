"""Evaluation metrics as plug-ins: a name, the harness kinds it applies to, and a per-episode value.

An env episode record has ``return``, ``episode_length``, ``success`` (None when the env reported no
``info["success"]``), ``time_to_completion_s`` and ``info_counts`` (steps whose ``info[key]`` was truthy, or
the sum when numeric). An agent session record has ``status``, ``reward``, ``num_calls``,
``prompt_tokens``, ``completion_tokens`` and ``time_to_completion_s``. A metric returns one number per
record (None: no value, e.g. ``success_rate`` of an env that never reports success); the report gives
their mean and its confidence interval. :func:`register_metric` adds one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    name: str
    kinds: tuple[str, ...]  # "env", "agent"
    value: Callable[[dict[str, Any], Any], float | None]  # (record, MetricSpec) -> value
    label: str = ""
    higher_is_better: bool | None = True


_METRICS: dict[str, Metric] = {}


def register_metric(metric: Metric) -> Metric:
    _METRICS[metric.name] = metric
    return metric


def metric_names() -> list[str]:
    return sorted(_METRICS)


def get_metric(name: str) -> Metric:
    return _METRICS[name]


def _agent_done(rec: dict[str, Any]) -> bool:
    return rec.get("status") == "done" and rec.get("reward") is not None


def _return(rec: dict[str, Any], spec: Any) -> float | None:
    if "return" in rec:
        return float(rec["return"])
    # an agent session: its reward, 0 for errors and timeouts (as polar run's held-out "success")
    return float(rec["reward"]) if _agent_done(rec) else 0.0


def _success(rec: dict[str, Any], spec: Any) -> float | None:
    if "return" in rec:
        return None if rec.get("success") is None else float(bool(rec["success"]))
    if not _agent_done(rec):
        return 0.0
    if isinstance(rec.get("success"), bool):  # the verifier's verdict: a shaped reward says nothing of success
        return float(rec["success"])
    return float(float(rec["reward"]) >= spec.success_threshold)


def _violations(rec: dict[str, Any], spec: Any) -> float | None:
    return float(rec.get("info_counts", {}).get(spec.info_key, 0.0))


def _cost(rec: dict[str, Any], spec: Any) -> float | None:
    return (rec["prompt_tokens"] * spec.usd_per_1m_prompt_tokens
            + rec["completion_tokens"] * spec.usd_per_1m_completion_tokens) / 1e6


for _m in (
    Metric("return", ("env", "agent"), _return, "return (agent: reward)"),
    Metric("success_rate", ("env", "agent"), _success, "success rate"),
    Metric("episode_length", ("env",), lambda r, s: float(r["episode_length"]), "episode length (steps)", None),
    Metric("time_to_completion_s", ("env", "agent"), lambda r, s: float(r["time_to_completion_s"]),
           "time to completion (s)", False),
    Metric("constraint_violations", ("env",), _violations, "constraint violations per episode", False),
    Metric("tokens_per_session", ("agent",), lambda r, s: float(r["prompt_tokens"] + r["completion_tokens"]),
           "tokens per session (prompt + sampled)", False),
    Metric("completion_tokens_per_session", ("agent",), lambda r, s: float(r["completion_tokens"]),
           "sampled tokens per session", False),
    Metric("calls_per_session", ("agent",), lambda r, s: float(r["num_calls"]), "model calls per session", None),
    Metric("cost_per_session_usd", ("agent",), _cost, "cost per session (USD)", False),
):
    register_metric(_m)
