"""A curriculum for env runs (``curriculum:``, docs/exploration.md): a list of env variants (stages), trained in
order; the run moves to the next stage once the success rate of the last ``window`` finished training episodes
(the env's ``info["success"]``) reaches ``threshold``. Each stage overrides keys of the harness's own settings:
``harness.kwargs`` (gymnasium ids) or ``harness.connector_spec.config`` (connectors)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from polar.config.base import StrictModel


class CurriculumStage(StrictModel):
    name: str | None = Field(None, min_length=1, description="how logs name the stage; default: its kwargs")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keys of harness.kwargs (gymnasium) or "
                                   "harness.connector_spec.config (connector) this stage sets")


class CurriculumConfig(StrictModel):
    stages: list[CurriculumStage] = Field(..., min_length=2, description="the env variants, easiest first")
    threshold: float = Field(0.8, description="advance once the window's success rate reaches this, in (0, 1]")
    window: int = Field(100, ge=1, description="finished training episodes the success rate is taken over")

    @field_validator("threshold")
    @classmethod
    def _in_unit_interval(cls, v: float) -> float:
        if not 0.0 < v <= 1.0:
            raise ValueError("a success rate in (0, 1] is needed")
        return v


def stage_label(stage: CurriculumStage, index: int) -> str:
    """How logs name stage ``index``: its ``name``, else its kwargs (``level=3``)."""
    return stage.name or ", ".join(f"{k}={v}" for k, v in stage.kwargs.items()) or f"stage {index}"


def stage_harness(harness: Any, stage: CurriculumStage, index: int) -> Any:
    """The run's harness section with stage ``index``'s kwargs applied; a connector stage may only set keys the
    harness's ``connector_spec.config`` already has (a typo would otherwise be ignored by the connector)."""
    if harness.type == "gymnasium":
        return harness.model_copy(update={"kwargs": {**harness.kwargs, **stage.kwargs}})
    if harness.type == "custom":
        spec = harness.connector_spec
        unknown = [k for k in stage.kwargs if k not in spec.config]
        if unknown:
            raise ValueError(f"curriculum.stages[{index}].kwargs.{unknown[0]}: not a key of "
                             f"harness.connector_spec.config ({', '.join(spec.config) or 'empty'}); a stage sets "
                             "the connector's own keys: add it there with its stage-0 value, or fix the name")
        new_spec = spec.model_copy(update={"config": {**spec.config, **stage.kwargs}})
        return harness.model_copy(update={"connector_spec": new_spec})
    raise ValueError(f"curriculum: harness.type {harness.type!r} has no stages; a curriculum varies gymnasium or "
                     "connector (custom) harnesses")
