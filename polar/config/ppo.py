"""PPO hyperparameters (``policy: {type: ppo, kwargs: {...}}``). Names follow Stable-Baselines3."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from polar.config.base import StrictModel

Schedule = Literal["constant", "linear"]


class PPOKwargs(StrictModel):
    learning_rate: float = Field(3e-4, gt=0)
    lr_schedule: Schedule = Field("constant", description="linear: decays to 0 at total_env_steps (SB3's lin_<x>)")
    n_steps: int = Field(128, ge=1, description="env steps per env per rollout")
    batch_size: int | None = Field(None, ge=1, description="minibatch size in samples (or set num_minibatches)")
    num_minibatches: int | None = Field(None, ge=1, description="minibatches per epoch (default 4 unless batch_size)")
    n_epochs: int = Field(4, ge=1)
    gamma: float = Field(0.99, ge=0, le=1)
    gae_lambda: float = Field(0.95, ge=0, le=1)
    clip_range: float = Field(0.2, gt=0)
    clip_range_schedule: Schedule = "constant"
    clip_range_vf: float | None = Field(None, gt=0, description="clip the value update around the old value; None = off")
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float | None = Field(0.5, gt=0)
    normalize_advantage: bool = True
    normalize_obs: bool = Field(False, description="running mean/std of Box observations, saved with checkpoints")
    normalize_reward: bool = Field(False, description="scale rewards by the std of the discounted return")
    clip_obs: float = Field(10.0, gt=0)
    clip_reward: float = Field(10.0, gt=0)
    target_kl: float | None = Field(None, gt=0, description="stop the epoch loop early when approx KL exceeds this")
    adam_eps: float = Field(1e-5, gt=0)

    @model_validator(mode="after")
    def _one_minibatch_rule(self) -> PPOKwargs:
        if self.batch_size is not None and self.num_minibatches is not None:
            raise ValueError("set either batch_size or num_minibatches, not both")
        return self
