"""PPO hyperparameters (``policy: {type: ppo, kwargs: {...}}``). Names follow Stable-Baselines3.

The defaults are sized so that the number of gradient steps per env step does not depend on how many
envs run: a rollout is ``rollout_samples`` (1,024) env steps in total, split across the envs
(``n_steps = ceil(1024 / num_envs)`` per env: 1,024 with 1 env, 128 with 8, 16 with 64), and a
minibatch is 64 samples, so every rollout gets 16 minibatches x 10 epochs = 160 gradient steps, one
per 6.4 samples, whatever the env count. That is Stable-Baselines3's update-to-sample ratio (2,048
samples, batch 64, 10 epochs on its default single env) with rollouts half as long, so learning
starts sooner. ``ent_coef`` stays 0.01 (SB3: 0): on FrozenLake 8x8 (slippery, reward only at the goal)
the policy otherwise collapses before it has found the goal. Setting ``n_steps`` (per env, as in SB3)
or ``num_minibatches`` opts out of the rule; ``benchmarks/defaults_vs_sb3.py`` measures the defaults
against SB3's (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from polar.config.base import StrictModel
from polar.config.intrinsic import IntrinsicConfig, refuse_policy_obs_normalization

Schedule = Literal["constant", "linear"]
DEFAULT_BATCH_SIZE = 64  # minibatch samples when neither batch_size nor num_minibatches is set


class PPOKwargs(StrictModel):
    learning_rate: float = Field(3e-4, gt=0)
    lr_schedule: Schedule = Field("constant", description="linear: decays to 0 at total_env_steps (SB3's lin_<x>)")
    n_steps: int | None = Field(
        None, ge=1, description="env steps per env per rollout; None = rollout_samples split across the envs"
    )
    rollout_samples: int = Field(
        1024, ge=1, description="env steps per rollout in total, used when n_steps is None: n_steps = ceil(this / num_envs)"
    )
    batch_size: int | None = Field(
        None, ge=1, description="minibatch size in samples; None = 64 unless num_minibatches is set"
    )
    num_minibatches: int | None = Field(None, ge=1, description="minibatches per epoch (instead of batch_size)")
    n_epochs: int = Field(10, ge=1)
    gamma: float = Field(0.99, ge=0, le=1)
    gae_lambda: float = Field(0.95, ge=0, le=1)
    clip_range: float = Field(0.2, gt=0)
    clip_range_schedule: Schedule = "constant"
    clip_range_vf: float | None = Field(None, gt=0, description="clip the value update around the old value; None = off")
    ent_coef: float = Field(0.01, description="entropy bonus; SB3's default is 0, sparse-reward tasks need it")
    vf_coef: float = 0.5
    max_grad_norm: float | None = Field(0.5, gt=0)
    normalize_advantage: bool = True
    normalize_obs: bool = Field(False, description="running mean/std of Box observations, saved with checkpoints")
    normalize_reward: bool = Field(False, description="scale rewards by the std of the discounted return")
    clip_obs: float = Field(10.0, gt=0)
    clip_reward: float = Field(10.0, gt=0)
    target_kl: float | None = Field(None, gt=0, description="stop the epoch loop early when approx KL exceeds this")
    adam_eps: float = Field(1e-5, gt=0)
    fused: Literal["auto", "off"] = Field(
        "auto", description="auto: for the built-in MLP agent (separate plain-MLP actor and critic), each minibatch's "
        "gradient is the hand-derived one of autograd_step (polar.algorithms.ppo_fused) and rollouts act through "
        "act's numpy twin, both only while autograd_step, the agent's act and evaluate_actions and what they call "
        "are the pinned stock code; an edit there, other agents, and off train by autograd and act through act. "
        "The run log says which runs."
    )

    intrinsic: IntrinsicConfig | None = Field(
        None, description="an intrinsic reward module ({type: rnd, ...}): novelty bonus with its own critic and "
        "normalizers (docs/exploration.md); None = extrinsic reward only"
    )

    @model_validator(mode="after")
    def _one_minibatch_rule(self) -> PPOKwargs:
        if self.batch_size is not None and self.num_minibatches is not None:
            raise ValueError("set either batch_size or num_minibatches, not both")
        refuse_policy_obs_normalization(self.normalize_obs, self.intrinsic)
        return self

    def steps_per_env(self, num_envs: int) -> int:
        """Env steps per env in one rollout: ``n_steps``, or ``rollout_samples`` split across ``num_envs``."""
        if self.n_steps is not None:
            return self.n_steps
        return max(1, math.ceil(self.rollout_samples / max(1, num_envs)))
