"""Sections for agentic runs: ``tasks``, ``verifier``, ``model``, ``trajectory``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from polar.config.base import StrictModel


class VerifierConfig(StrictModel):
    type: str = "exact_match"
    kwargs: dict[str, Any] = Field(default_factory=dict)


class ModelConfig(StrictModel):
    name_or_path: str = "tiny"


class TrajectoryConfig(StrictModel):
    builder: Literal["per_request", "prefix_merging"] = "prefix_merging"
