"""``policy:`` section: ``{type: <algorithm>, kwargs: {...}}``, one typed kwargs model per algorithm."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from polar.config.base import StrictModel


class PPOKwargs(StrictModel):
    learning_rate: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2


class PPOPolicyConfig(StrictModel):
    type: Literal["ppo"] = "ppo"
    kwargs: PPOKwargs = Field(default_factory=PPOKwargs)


PolicyConfig = Annotated[PPOPolicyConfig, Field(discriminator="type")]
