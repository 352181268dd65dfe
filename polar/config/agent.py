"""``agent:`` section: a built-in network or a user's own ``AgentBase`` class."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from polar.config.base import StrictModel


class BuiltinAgentConfig(StrictModel):
    type: Literal["mlp", "cnn", "lstm"] = "mlp"
    hidden_sizes: list[int] = Field(default_factory=lambda: [64, 64])


class CustomAgentConfig(StrictModel):
    type: Literal["custom"] = "custom"
    module: str
    class_name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


AgentConfig = Annotated[BuiltinAgentConfig | CustomAgentConfig, Field(discriminator="type")]
