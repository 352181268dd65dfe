"""Intrinsic reward for on-policy env runs (``policy.kwargs.intrinsic``, docs/exploration.md).

``{type: rnd, ...}``: Random Network Distillation (Burda et al. 2018, arXiv:1810.12894). A fixed random
*target* network embeds each observation; a *predictor* learns to match it on the states the policy visits, and
its error is the novelty bonus. The defaults are the paper's where they fit a small MLP (coefficients 2 and 1,
intrinsic gamma 0.99, a quarter of each batch trains the predictor, observations clipped to 5 std).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polar.config.base import StrictModel


class RNDConfig(StrictModel):
    type: Literal["rnd"] = "rnd"
    coef: float = Field(1.0, gt=0, description="weight of the intrinsic advantage (the paper's 1)")
    ext_coef: float = Field(2.0, ge=0, description="weight of the extrinsic advantage (the paper's 2)")
    gamma: float = Field(0.99, ge=0, lt=1, description="discount of the intrinsic return (non-episodic)")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda of the intrinsic advantage")
    hidden_sizes: list[int] = Field([256, 256], min_length=1, description="target, predictor and intrinsic critic MLPs")
    embedding_dim: int = Field(128, ge=1, description="width of the target's (and predictor's) output")
    learning_rate: float = Field(1e-4, gt=0, description="Adam step of the predictor and the intrinsic critic")
    update_proportion: float = Field(0.25, gt=0, le=1, description="share of each minibatch the predictor trains on")
    n_epochs: int = Field(4, ge=1, description="epochs over the batch for the predictor and the intrinsic critic")
    batch_size: int = Field(256, ge=1, description="minibatch samples of those epochs")
    obs_clip: float = Field(5.0, gt=0, description="normalized observations are clipped to +-this (the paper's 5)")


def refuse_policy_obs_normalization(normalize_obs: bool, intrinsic: RNDConfig | None) -> None:
    """RND reads each step's raw next observation (``Fragment.next_obs``) and normalizes it itself; its intrinsic
    critic bootstraps from the last one, which must be in the policy's own view: a policy that normalizes its
    observations would give the critic two different views of a state."""
    if intrinsic is not None and normalize_obs:
        raise ValueError("normalize_obs: true with intrinsic: RND normalizes the raw observations itself (obs_clip) "
                         "and its critic needs the policy's observations raw; set normalize_obs: false")


IntrinsicConfig = RNDConfig  # ICM would join here as a discriminated union on ``type``
