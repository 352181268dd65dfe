"""A LoRA run on replicas polar launches gets them started with LoRA support (``max_lora_rank: lora.r``) unless
the config says otherwise: before, such a run compiled and started vLLM for minutes, then failed at the
learner's build because the replica could not take adapters."""

from __future__ import annotations

from typing import Any

from polar.config import validate_run_config
from polar.trainers.agentic_run import _model_spec, launched_engine_kwargs


def _kwargs(policy_kwargs: dict[str, Any], engine_kwargs: dict[str, Any] | None = None,
            gateway: dict[str, Any] | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "t", "harness": {"type": "agent", "callable": "polar.harness.benchmarks.chat:answer"},
        "tasks": "tasks.jsonl",
        "model": {"name_or_path": "smollm2-135m", "engine": "vllm", "engine_kwargs": engine_kwargs or {}},
        "policy": {"type": "grpo", "kwargs": {"total_steps": 1, **policy_kwargs}}}
    if gateway is not None:
        raw["gateway"] = gateway
    cfg = validate_run_config(raw)
    return launched_engine_kwargs(cfg, _model_spec(cfg)[2])


def test_a_lora_run_launches_replicas_that_take_adapters_of_its_rank() -> None:
    assert _kwargs({"lora": {"r": 16}})["max_lora_rank"] == 16


def test_the_configured_rank_and_merged_sync_are_left_as_they_are() -> None:
    assert _kwargs({"lora": {"r": 8}}, {"max_lora_rank": 32})["max_lora_rank"] == 32
    assert "max_lora_rank" not in _kwargs({"lora": {"r": 8}}, gateway={"sync": {"lora": "merged"}})
    assert "max_lora_rank" not in _kwargs({})
