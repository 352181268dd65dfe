"""``harness:`` section. A discriminated union on ``type``.

- ``gymnasium``: any registered Gymnasium id, no code.
- ``custom``: a user's connector class (or any-language connector command) in its own process.
- ``agent``: a black-box LLM agent harness (command, Python callable or preset) behind the gateway.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from polar.config.base import StrictModel


class GymnasiumHarnessConfig(StrictModel):
    type: Literal["gymnasium"] = "gymnasium"
    id: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


class ConnectorSpec(StrictModel):
    """Where the connector class lives and how polar talks to its process."""

    module: str | None = Field(None, description="Python module; resolved next to the config file, then the cwd")
    class_name: str | None = None
    command: list[str] | None = Field(None, description="non-Python connector: command that serves the wire protocol")
    config: dict[str, Any] = Field(default_factory=dict)


class CustomHarnessConfig(StrictModel):
    type: Literal["custom"] = "custom"
    connector_spec: ConnectorSpec


class AgentHarnessConfig(StrictModel):
    """A black-box agent harness. Owned by polar.agentic; presets (claude_code, codex, ...) by polar.agentic.presets."""

    type: Literal["agent"] = "agent"
    command: list[str] | None = None
    preset: str | None = None
    preset_options: dict[str, Any] = Field(default_factory=dict)


HarnessConfig = Annotated[
    GymnasiumHarnessConfig | CustomHarnessConfig | AgentHarnessConfig,
    Field(discriminator="type"),
]
