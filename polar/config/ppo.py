"""PPO hyperparameters (``policy: {type: ppo, kwargs: {...}}``)."""

from __future__ import annotations

from polar.config.base import StrictModel


class PPOKwargs(StrictModel):
    learning_rate: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
