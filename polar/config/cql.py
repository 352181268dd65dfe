"""CQL hyperparameters (``policy: {type: cql, kwargs: {dataset: ...}}``; Kumar et al. 2020, d3rlpy's defaults).

Discrete actions: CQL(H) on a Q-network (d3rlpy's ``DiscreteCQL``: Double DQN's Huber TD loss plus
``conservative_weight * (logsumexp_a Q(s, a) - Q(s, a_data))``); the agent is that Q-network (DQN's), acting
greedily. Box actions: SAC with twin critics whose loss adds the same gap, the logsumexp taken over
``n_action_samples`` uniform and policy actions (importance-weighted); the agent is SAC's squashed Gaussian.
The networks come from ``agent:`` as for DQN/SAC (``hidden_sizes``, default 256-256, ReLU).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from polar.config.bc import OfflineKwargs


class CQLKwargs(OfflineKwargs):
    network: ClassVar[str] = "off_policy"  # DQN's / SAC's networks (polar.models.policy.build_policy)
    actions: ClassVar[str] = "either"  # DQN's Q-network for Discrete actions, SAC's actor for Box ones
    default_hidden: ClassVar[list[int]] = [256, 256]  # d3rlpy's
    gamma: float = Field(0.99, ge=0, le=1)
    tau: float = Field(0.005, gt=0, le=1, description="Polyak coefficient of the target networks (1.0: a hard copy)")
    target_update_interval: int = Field(1, ge=1, description="gradient steps between target updates")
    conservative_weight: float | None = Field(None, ge=0, description="weight of the CQL gap; None: 1.0 for "
                                              "Discrete actions (d3rlpy DiscreteCQL's alpha), 5.0 for Box (d3rlpy CQL)")
    # Box actions only
    n_action_samples: int = Field(10, ge=1, description="Box: uniform and policy actions per state in the logsumexp")
    alpha_threshold: float = Field(10.0, description="Box: the Lagrange multiplier grows while the gap exceeds this")
    initial_alpha: float = Field(1.0, gt=0, description="Box: the Lagrange multiplier on the gap at the start")
    alpha_learning_rate: float = Field(1e-4, ge=0, description="Box: its learning rate; 0 keeps it at initial_alpha")
    actor_learning_rate: float = Field(1e-4, gt=0, description="Box: the actor's (the critics' is learning_rate)")
    ent_coef: Literal["auto"] | float = Field("auto", description="Box: SAC's temperature, 'auto' learns it")
    initial_ent_coef: float = Field(1.0, gt=0, description="Box: the learned temperature's start")
    temperature_learning_rate: float = Field(1e-4, gt=0)
    target_entropy: Literal["auto"] | float = Field("auto", description="Box: 'auto' is -dim(A)")
    critic_hidden: list[int] | None = Field(None, min_length=1, description="Box: the critics' layers; None: the "
                                            "agent's hidden_sizes")
