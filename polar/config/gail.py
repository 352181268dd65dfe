"""Adversarial imitation from demonstrations (``policy: {type: gail | airl, kwargs: {dataset: ..., ...}}``).

GAIL (Ho & Ermon, 2016) and AIRL (Fu et al., 2018) train a discriminator to tell the expert's transitions
(a Minari dataset, as ``polar collect`` writes) from the policy's own, and train the policy with PPO on the
discriminator's reward instead of the env's. The kwargs are PPO's (the generator is polar's PPO learner) plus the
discriminator's. The env's reward is never used for learning; it is still logged (``episode_reward_mean``) and
evaluated, which is how a run shows how much of the expert's return it recovered.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from polar.config.base import StrictModel
from polar.config.ppo import PPOKwargs


class GAILKwargs(PPOKwargs):
    """PPO's kwargs (the generator) plus the discriminator's."""

    dataset: str = Field(..., min_length=1, description="the expert's demonstrations: a Minari dataset folder "
                         "(relative to the config file) or a local id under MINARI_DATASETS_PATH; polar collect "
                         "writes one. Its spaces must be the env's")
    disc_hidden: list[int] = Field([64, 64], min_length=1, description="the discriminator MLP's hidden layer sizes")
    disc_learning_rate: float = Field(3e-4, gt=0, description="the discriminator's Adam step size")
    disc_updates: int = Field(4, ge=1, description="discriminator gradient steps per rollout (before PPO's epochs)")
    disc_batch_size: int = Field(256, ge=1, description="expert and policy samples each, per discriminator step")
    disc_grad_penalty: float = Field(0.0, ge=0, description="gradient penalty on the discriminator's inputs "
                                     "(interpolates of expert and policy samples); 0 = off")

    @model_validator(mode="after")
    def _discriminator_reward_only(self) -> GAILKwargs:
        if self.normalize_reward:
            raise ValueError("normalize_reward: the return normaliser scales the env's reward, which an imitation run "
                             "never learns from (its reward is the discriminator's); set normalize_reward: false")
        if self.normalize_obs:
            raise ValueError("normalize_obs: the discriminator standardises observations by the expert dataset's "
                             "mean/std and needs the raw ones from rollouts; set normalize_obs: false")
        return self


class AIRLKwargs(GAILKwargs):
    """GAIL's kwargs; AIRL's discriminator also reads the next observation (its shaping term h(s'))."""

    keeps_next_obs: ClassVar[bool] = True  # rollouts record next_obs (the final one where an episode ended)


class GAILPolicyConfig(StrictModel):
    type: Literal["gail"] = "gail"
    kwargs: GAILKwargs


class AIRLPolicyConfig(StrictModel):
    type: Literal["airl"] = "airl"
    kwargs: AIRLKwargs
