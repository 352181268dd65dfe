"""GRPO and SFT hyperparameters for LLM policies (``policy: {type: grpo|sft, kwargs: {...}}``)."""

from __future__ import annotations

from polar.config.base import StrictModel


class GRPOKwargs(StrictModel):
    group_size: int = 4
    learning_rate: float = 1e-5
    kl_coef: float = 0.0


class SFTKwargs(StrictModel):
    learning_rate: float = 1e-4
