"""MBPO hyperparameters (``policy: {type: mbpo, kwargs: {...}}``): SAC's (``polar/config/sac.py``, the same names
and meaning: SAC's learner trains on them) plus the dynamics model and its rollouts (Janner et al. 2019,
"When to Trust Your Model"; names follow the authors' code where it has one).

Every ``model_train_freq`` env steps the ensemble is refit on the real replay buffer and
``rollout_batch_size`` states drawn from it are rolled out ``rollout_length`` steps through the model into the
model buffer; each gradient step of SAC samples ``real_ratio`` of its batch from the real buffer and the rest
from the model buffer. The defaults are a small ensemble for a CPU box (the paper: 7 networks, 5 elites,
4x200 hidden, 100k rollouts per round, 20 gradient steps per env step); docs/model-based.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from polar.config.base import StrictModel
from polar.config.sac import SACKwargs
from polar.errors import ConfigError

Termination = Literal["learned", "env", "never"]


class MBPOKwargs(SACKwargs):
    @model_validator(mode="before")
    @classmethod
    def _renamed_n_steps(cls, data: Any) -> Any:
        """``n_steps`` means env steps per env in one fragment (PPO, APPO); MBPO's model horizon is ``rollout_length``."""
        if isinstance(data, dict) and "n_steps" in data:
            raise ConfigError("policy.kwargs.n_steps: mbpo has no n_steps (PPO's and APPO's steps per env in a "
                              "fragment); did you mean rollout_length (the model rollouts' horizon)? Rename the key")
        return data

    # SAC's, with MBPO's defaults
    learning_starts: int = Field(1000, ge=0, description="env steps of uniform-random actions before the first "
                                 "model fit, rollouts and SAC training")
    gradient_steps: int | None = Field(
        10, ge=-1, description="SAC gradient steps per training phase (per env step with one env: MBPO's G, 20 in "
        "the paper); None = one per train_freq transitions, -1 = one per transition collected")
    n_step_return: int = Field(1, ge=1, description="1 only: the model learns and rolls out one-step transitions")

    # the dynamics model: an ensemble of Gaussians over (next_obs - obs, reward)
    ensemble_size: int = Field(5, ge=1, description="networks in the dynamics ensemble (the paper: 7)")
    num_elites: int = Field(3, ge=1, description="networks with the lowest holdout error that roll out (the paper: 5)")
    model_hidden_sizes: list[int] = Field([200, 200, 200], min_length=1,
                                          description="hidden layers of each ensemble member (the paper: 4x200)")
    model_learning_rate: float = Field(1e-3, gt=0)
    model_weight_decay: float = Field(5e-5, ge=0, description="L2 on the ensemble's weights")
    model_batch_size: int = Field(256, ge=1)
    model_train_freq: int = Field(250, ge=1, description="env steps between model fits (each followed by a rollout "
                                  "round)")
    model_holdout_ratio: float = Field(0.2, gt=0, lt=1, description="share of real transitions (at most 5000) "
                                       "held out to pick elites and stop fitting")
    model_patience: int = Field(5, ge=1, description="stop a fit after this many epochs without a 1% holdout gain")
    model_max_epochs: int = Field(50, ge=1, description="epochs over the real data in one fit, at most")
    termination: Termination = Field(
        "learned", description="when a model rollout ends: learned (a classifier of the real buffer's terminal "
        "next states), env (polar's copy of the env's own rule: Hopper, Walker2d, Ant, InvertedPendulum, "
        "InvertedDoublePendulum, MountainCarContinuous; never for Pendulum, HalfCheetah, Swimmer, Reacher, Pusher), "
        "never")

    # the model rollouts
    rollout_batch_size: int = Field(10_000, ge=1, description="states branched from the real buffer per rollout "
                                    "round (the paper: 100k)")
    rollout_length: int | tuple[int, int, int, int] = Field(
        1, description="k, model steps per branch; or [from_env_steps, to_env_steps, from_k, to_k]: k grows "
        "linearly between those env steps (the paper's schedule, in env steps instead of epochs)")
    model_retain_rounds: int = Field(4, ge=1, description="rollout rounds the model buffer holds (at the longest k)")
    real_ratio: float = Field(0.05, gt=0, lt=1, description="share of each SAC batch drawn from the real buffer (at "
                              "least one transition from each buffer)")

    @model_validator(mode="after")
    def _consistent(self) -> MBPOKwargs:
        if self.n_step_return != 1:
            raise ValueError(f"n_step_return {self.n_step_return}: mbpo's model learns one-step transitions and SAC "
                             "trains on them; set n_step_return: 1 (or train with policy.type: sac for n-step returns)")
        if self.num_elites > self.ensemble_size:
            raise ValueError(f"num_elites ({self.num_elites}) must be at most ensemble_size ({self.ensemble_size})")
        if any(h < 1 for h in self.model_hidden_sizes):
            raise ValueError(f"model_hidden_sizes must be positive layer widths, got {self.model_hidden_sizes}")
        k = self.rollout_length
        if isinstance(k, int):
            if k < 1:
                raise ValueError(f"rollout_length must be >= 1 model step, got {k}")
        else:
            start, end, k0, k1 = k
            if not (0 <= start < end) or k0 < 1 or k1 < 1:
                raise ValueError(f"rollout_length [from_env_steps, to_env_steps, from_k, to_k] needs 0 <= from_env_steps "
                                 f"< to_env_steps and k >= 1; got {list(k)}")
        return self

    @property
    def max_rollout_length(self) -> int:
        k = self.rollout_length
        return k if isinstance(k, int) else max(k[2], k[3])

    def rollout_length_at(self, env_steps: int) -> int:
        """k after ``env_steps``: fixed, or linear between the schedule's env steps (rounded down)."""
        k = self.rollout_length
        if isinstance(k, int):
            return k
        start, end, k0, k1 = k
        frac = min(1.0, max(0.0, (env_steps - start) / (end - start)))
        return int(k0 + frac * (k1 - k0))

    @property
    def model_buffer_size(self) -> int:
        """Transitions the model buffer holds: ``model_retain_rounds`` rounds at the longest k."""
        return self.rollout_batch_size * self.max_rollout_length * self.model_retain_rounds


class MBPOPolicyConfig(StrictModel):
    type: Literal["mbpo"] = "mbpo"
    kwargs: MBPOKwargs = Field(default_factory=MBPOKwargs)
