"""IQL hyperparameters (``policy: {type: iql, kwargs: {dataset: ...}}``; Kostrikov et al. 2021, CORL's defaults).

Discrete and continuous actions; the agent is the classic one (``agent:``), the critics belong to the learner.
"""

from __future__ import annotations

from pydantic import Field

from polar.config.bc import OfflineKwargs


class IQLKwargs(OfflineKwargs):
    gamma: float = Field(0.99, ge=0, le=1)
    expectile: float = Field(0.7, gt=0, lt=1, description="tau of the expectile regression of V towards Q")
    temperature: float = Field(3.0, ge=0, description="beta: advantage weights exp(beta * (Q - V))")
    max_weight: float = Field(100.0, gt=0, description="advantage weights are clipped here")
    tau: float = Field(0.005, gt=0, le=1, description="Polyak coefficient of the target critics")
    critic_hidden: list[int] = Field(default_factory=lambda: [256, 256], min_length=1)
