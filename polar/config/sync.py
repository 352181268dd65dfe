"""``sync:`` how a run's new weights reach the engine that serves its sessions, at every policy update."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polar.config.base import StrictModel

# a fixed prompt whose greedy continuation the learner and every replica score after each sync
DEFAULT_CHECK_PROMPT = "Count from one to ten in words, separated by commas."


class WeightSyncConfig(StrictModel):
    """Weight sync into the serving engine (embedded, launched vLLM, or external vLLM/SGLang URLs).

    At each sync the gateway stops admitting calls, lets the ones under way finish (``in_flight:
    finish``, bounded by ``timeout_s``) or aborts them (``abort``: their records end with
    ``finish_reason: abort``), pushes the weights into every replica, sets its weight version, checks
    it, and resumes. Upstream engines get the weights as a safetensors folder written to ``dir``. With
    ``continue`` (the embedded engine; partial rollouts) nothing pauses: the calls under way go on under
    the new weights, and their records carry each sampled token's version (``sampled_versions``)."""

    in_flight: Literal["finish", "abort", "continue"] = Field(
        "finish", description="calls under way at a sync: let them finish (up to timeout_s), abort them, or "
                              "continue them under the new weights (embedded engine; partial rollouts)")
    timeout_s: float = Field(300.0, gt=0, description="longest wait for in-flight calls, and for each replica's push")
    method: Literal["disk", "nccl"] = Field(
        "disk", description="upstream engines: disk = each replica reloads a safetensors folder (vLLM "
        "reload_weights, SGLang update_weights_from_disk); nccl = vLLM's NCCL weight-transfer API (GPU only)")
    lora: Literal["adapters", "merged"] = Field(
        "adapters", description="a LoRA run into vLLM: adapters = load only the adapters (vLLM --enable-lora, "
        "/v1/load_lora_adapter, named polar-v<version>); merged = the merged full weights, as a full fine-tune")
    keep_adapters: int = Field(2, ge=1, le=16, description="LoRA adapters each replica keeps loaded (the newest "
                               "serves); older ones are unloaded")
    dir: str | None = Field(None, description="where the synced weights folder is written (default: <run dir>/weight_sync)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype of the written weights; auto: the launched server's --dtype, else float32")
    check: bool = Field(True, description="after each sync, compare each replica's logprobs on a fixed prompt with the learner's")
    check_tolerance: float = Field(
        0.3, gt=0, description="largest |replica - learner| logprob of one token of the fixed prompt's greedy "
        "continuation (a bf16 vLLM against the fp32 learner on SmolLM2-135M: 0.08 base, 0.13 perturbed)")
    check_tokens: int = Field(16, ge=1, le=256, description="greedy tokens of the fixed prompt that are compared")
    check_prompt: str = Field(DEFAULT_CHECK_PROMPT, description="the fixed prompt (a user message, chat-rendered)")
