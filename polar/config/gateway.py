"""``gateway:`` section (also read by ``polar gateway --config``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from polar.config.base import StrictModel
from polar.config.secrets import secret_field
from polar.config.sync import WeightSyncConfig


class ActionCacheConfig(StrictModel):
    """The action cache (``polar.inference.action_cache``): greedy answers replayed per policy version."""

    max_entries: int = Field(4096, ge=1, description="most answers kept; the least recently used go first")
    max_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="most bytes kept (prompt ids, tokens, logprobs)")


class GatewayConfig(StrictModel):
    """The model-API gateway: where it listens, which engine it fronts, and its limits."""

    host: str = Field("127.0.0.1", description="listen address; loopback by default, set 0.0.0.0 deliberately")
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    model: str = Field("tiny", description="engine spec: 'tiny', a local HF folder, 'vllm:URL[,URL]', 'sglang:URL'")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="extra arguments for load_engine")
    chat_template: str | None = Field(
        None, description="'model', 'hermes-tools' or a Jinja file; default: the model's own when it renders "
        "tools, else hermes-tools (ChatML models)")
    engine: Literal["embedded", "vllm", "openai_compat"] = Field(
        "embedded", description="vllm: launch and supervise vLLM servers of the model folder or preset; "
        "openai_compat: forward to the chat endpoint at base_url, serving its model 'model'"
    )
    base_url: str | None = Field(None, description="engine: openai_compat: the endpoint, up to /v1")
    api_key_env: str | None = Field(None, description="engine: openai_compat: the variable holding its API key")
    replicas: int = Field(1, ge=1, description="engine: vllm: how many vLLM servers to launch")
    engine_log_dir: str | None = Field(None, description="engine: vllm: replica logs (default: next to records_dir)")
    model_aliases: list[str] = Field(default_factory=list, description="more model names clients may ask for")
    accept_any_model: bool = Field(False, description="serve every model name (harnesses with fixed names)")
    records_dir: str | None = Field(None, description="where session JSONL records go; default <run dir>/gateway/sessions")
    fsync: bool = Field(False, description="fsync each record (survives power loss; slower)")
    resume_records: bool = Field(False, description="continue the sessions already in records_dir (else refuse to start there)")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    default_max_tokens: int = Field(1024, ge=1, description="when a request sets none (clamped to the context)")
    pause_mode: Literal["wait", "reject"] = Field("wait", description="while paused: wait for resume, or 429 at once")
    pause_wait_s: float = Field(30.0, ge=0, description="longest wait before a paused call gets 429")
    retry_after_s: float = Field(1.0, gt=0, description="Retry-After sent with 429")
    admin_token: str | None = secret_field(
        "POLAR_GATEWAY_ADMIN_TOKEN", "required on /admin/* and to read others' sessions when set; polar's runs set a "
        "random one of their own, kept in memory; `polar gateway` also reads --admin-token-file")
    claimed_sessions_only: bool = Field(
        False, description="only sessions given to a key beforehand (POST /admin/claim) take calls; polar's runs "
        "set it, so a harness can create no session but its own")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="more Host names the gateway answers besides IP literals, loopback names "
        "and `host` (DNS-rebinding guard); ['*'] turns the check off")
    action_cache: ActionCacheConfig | None = Field(
        None, description="replay the answer to a greedy prompt seen before at the same policy version (serving and "
        "polar eval --action-cache; refused in training runs): docs/inference.md, Action cache")
    sync: WeightSyncConfig = Field(
        default_factory=WeightSyncConfig, description="weight sync into the engine: in-flight calls, the "
        "weights folder, the logprob check (docs/agentic.md, Engines and weight sync)")
