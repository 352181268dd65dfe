"""APPO hyperparameters (``policy: {type: appo, kwargs: {...}}``): asynchronous PPO with V-trace.

Rollout workers act with whatever weights they last received; the learner consumes batches as
they arrive and corrects for the lag between the behaviour and the current policy with V-trace
(IMPALA, Espeholt et al. 2018). Names follow PPO's where the meaning is the same.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from polar.config.base import StrictModel
from polar.config.intrinsic import IntrinsicConfig, refuse_policy_obs_normalization


class APPOKwargs(StrictModel):
    learning_rate: float = Field(5e-4, gt=0)
    gamma: float = Field(0.99, ge=0, le=1)
    n_steps: int = Field(64, ge=1, description="env steps per env in one rollout fragment (time dimension T)")
    clip_range: float = Field(0.2, gt=0, description="PPO-style clip on the target/behaviour ratio")
    vtrace_clip_rho: float = Field(1.0, gt=0, description="rho-bar: truncation of importance weights in the TD term")
    vtrace_clip_c: float = Field(1.0, gt=0, description="c-bar: truncation of the trace-cutting weights")
    # value loss = vf_coef * MSE (PPO's and SB3's convention); 0.25 is the 0.5 * (MSE / 2) APPO used before
    vf_coef: float = Field(0.25, ge=0, description="weight of the value loss, vf_coef * MSE to the V-trace targets")
    ent_coef: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(0.5, gt=0)
    # Minibatches of a fixed size over each fragment, two epochs: 2 gradient steps per 64 env steps
    # whatever the env count (one step per whole fragment meant 8x fewer updates per sample at 8 envs).
    # V-trace corrects the drift across epochs; 4 epochs hurt at 1 env (docs/benchmarks.md).
    n_epochs: int = Field(2, ge=1, description="passes over each arriving batch")
    batch_size: int = Field(64, ge=0, description="minibatch size in env steps; 0 = the whole fragment")
    normalize_advantage: bool = True
    adam_eps: float = Field(1e-5, gt=0)
    normalize_obs: bool = Field(False, description="running mean/std of Box observations, saved with checkpoints")
    normalize_reward: bool = Field(False, description="scale rewards by the std of the discounted return")
    clip_obs: float = Field(10.0, gt=0)
    clip_reward: float = Field(10.0, gt=0)
    max_policy_lag: int = Field(20, ge=0, description="drop fragments more than this many updates behind (0 = never)")
    intrinsic: IntrinsicConfig | None = Field(
        None, description="an intrinsic reward module ({type: rnd, ...}), as PPO's (docs/exploration.md)")

    @model_validator(mode="after")
    def _intrinsic_reads_raw_observations(self) -> APPOKwargs:
        refuse_policy_obs_normalization(self.normalize_obs, self.intrinsic)
        return self
