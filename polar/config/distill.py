"""Policy distillation of a classic agent (``policy: {type: distill, kwargs: {teacher: RUN_OR_CHECKPOINT}}``).

The student (this run's ``agent``, usually smaller) acts in the env, and each update lowers KL(teacher || student)
over the action distributions at the states it visited (Rusu et al. 2016, "Policy Distillation"; student-driven
data as in DAgger, so the student learns to recover from its own mistakes). The result is an ordinary policy:
``polar eval``, ``export`` and ``serve`` take it like any other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polar.config.base import StrictModel


class DistillKwargs(StrictModel):
    teacher: str = Field(..., min_length=1, description="the teacher: a polar env run folder (its latest checkpoint) "
                         "or a checkpoint file in one, relative to the config file; its run must name no code")
    temperature: float = Field(1.0, gt=0, description="the teacher's softmax temperature over logits (or over "
                               "Q-values for a DQN teacher); below 1 sharpens its targets (Rusu et al. use 0.01 on Q)")
    n_steps: int = Field(128, ge=1, description="env steps per env the student acts between updates")
    n_epochs: int = Field(4, ge=1, description="passes over each batch of visited states")
    batch_size: int = Field(256, ge=1, description="states per minibatch")
    learning_rate: float = Field(1e-3, gt=0)
    max_grad_norm: float | None = Field(None, gt=0)


class DistillPolicyConfig(StrictModel):
    type: Literal["distill"] = "distill"
    kwargs: DistillKwargs
