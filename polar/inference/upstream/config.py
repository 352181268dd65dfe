"""What an upstream inference service is: its kind, its replicas' URLs, the served model's tokenizer, timeouts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polar.config.base import StrictModel

UpstreamKind = Literal["vllm", "sglang"]
UPSTREAM_KINDS: tuple[UpstreamKind, ...] = ("vllm", "sglang")


class UpstreamConfig(StrictModel):
    """An upstream inference service: one or more replicas of the same model."""

    kind: UpstreamKind
    urls: list[str] = Field(min_length=1)
    tokenizer: str = "tiny"  # "tiny" or a local HF folder with the served model's tokenizer
    served_model: str | None = None  # vLLM "model" field; default: the first id from GET /v1/models
    model_name: str | None = None  # name reported to clients; default: served_model or the tokenizer name
    context_length: int | None = None  # default: the tokenizer's model_max_length
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    cooldown_s: float = 10.0
    api_key: str | None = None
    health_timeout_s: float = Field(2.0, gt=0)  # each replica's GET /health probe
    health_ttl_s: float = Field(2.0, ge=0)  # how long a probe's answer is reused by /health

    def auth_headers(self) -> dict[str, str]:
        """``Authorization: Bearer <api_key>`` when the service has a key, else nothing."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
