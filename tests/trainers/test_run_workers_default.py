"""``sessions.max_run_workers``'s default follows what a session costs: a program per session runs 8 at once,
an in-process callable 32 (the embedded engine's batch); a value given in the config always wins."""

from __future__ import annotations

from polar.config import validate_run_config
from polar.trainers.agentic_run import pipeline_settings


def _cfg(harness: dict, sessions: dict | None = None):
    raw = {"name": "t", "harness": harness, "tasks": "tasks.jsonl",
           "model": {"name_or_path": "tiny"}, "policy": {"type": "grpo", "kwargs": {"total_steps": 1}}}
    if sessions is not None:
        raw["sessions"] = sessions
    return validate_run_config(raw)


def test_an_in_process_callable_runs_as_many_sessions_as_the_engine_batches() -> None:
    cfg = _cfg({"type": "agent", "callable": "polar.harness.benchmarks.chat:answer"})
    assert pipeline_settings(cfg).max_run_workers == 32


def test_a_program_per_session_runs_eight_at_once() -> None:
    cfg = _cfg({"type": "agent", "command": ["python", "-c", "pass"]})
    assert pipeline_settings(cfg).max_run_workers == 8


def test_the_configured_value_wins() -> None:
    cfg = _cfg({"type": "agent", "callable": "polar.harness.benchmarks.chat:answer"}, {"max_run_workers": 3})
    assert pipeline_settings(cfg).max_run_workers == 3
    cfg = _cfg({"type": "agent", "command": ["python", "-c", "pass"]}, {"max_run_workers": 12})
    assert pipeline_settings(cfg).max_run_workers == 12
