"""What ``policy.kwargs.partial_rollouts`` asks of the rest of an agent run's config."""

from __future__ import annotations

from polar.config.agentic import ModelConfig
from polar.config.gateway import GatewayConfig


def check_partial_rollouts(model: ModelConfig | None, gateway: GatewayConfig) -> None:
    """An engine that can go on sampling across a weight update (the embedded one), and a gateway that lets it:
    ``gateway.sync.in_flight`` is set to ``continue`` (the resolved config says so); one set to anything else is
    refused, as is another engine. Raises ``ValueError`` naming the key."""
    key, engine = ("model.engine", str(model.engine)) if model is not None else ("gateway.engine", str(gateway.engine))
    spec = model.name_or_path if model is not None else gateway.model
    if engine == "embedded" and spec.partition(":")[0] in ("vllm", "sglang"):
        key, engine = ("model.name_or_path" if model is not None else "gateway.model"), spec.partition(":")[0]
    if engine != "embedded":
        raise ValueError(f"policy.kwargs.partial_rollouts: {key} {engine!r} cannot go on sampling a call across a "
                         "weight update (each token tagged with the version that sampled it); use the embedded "
                         "engine, or drop partial_rollouts for one-step-off overlap (max_off_policy_steps: 1)")
    sync = gateway.sync
    if sync.in_flight != "continue":
        if "in_flight" in sync.model_fields_set:
            raise ValueError(f"policy.kwargs.partial_rollouts: calls under way go on across a weight update, and "
                             f"gateway.sync.in_flight is {sync.in_flight!r}; set it to continue, or leave it out")
        object.__setattr__(sync, "in_flight", "continue")
