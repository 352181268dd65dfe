"""``policy:`` section: ``{type: <algorithm>, kwargs: {...}}``, one typed kwargs model per algorithm.

Each algorithm's kwargs live in their own module (``ppo.py``, ``grpo.py``, ...); this file pairs each with its
``type`` name, and ``run.py`` joins them into the env-run and agent-run unions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polar.config.appo import APPOKwargs
from polar.config.base import StrictModel
from polar.config.bc import BCKwargs
from polar.config.cql import CQLKwargs
from polar.config.dqn import DQNKwargs
from polar.config.grpo import GRPOKwargs, SFTKwargs
from polar.config.iql import IQLKwargs
from polar.config.ppo import PPOKwargs
from polar.config.sac import SACKwargs


class PPOPolicyConfig(StrictModel):
    type: Literal["ppo"] = "ppo"
    kwargs: PPOKwargs = Field(default_factory=PPOKwargs)


class APPOPolicyConfig(StrictModel):
    type: Literal["appo"] = "appo"
    kwargs: APPOKwargs = Field(default_factory=APPOKwargs)


class GRPOPolicyConfig(StrictModel):
    type: Literal["grpo"] = "grpo"
    kwargs: GRPOKwargs = Field(default_factory=GRPOKwargs)


class SFTPolicyConfig(StrictModel):
    type: Literal["sft"] = "sft"
    kwargs: SFTKwargs = Field(default_factory=SFTKwargs)


class DQNPolicyConfig(StrictModel):
    type: Literal["dqn"] = "dqn"
    kwargs: DQNKwargs = Field(default_factory=DQNKwargs)


class SACPolicyConfig(StrictModel):
    type: Literal["sac"] = "sac"
    kwargs: SACKwargs = Field(default_factory=SACKwargs)


class BCPolicyConfig(StrictModel):
    type: Literal["bc"] = "bc"
    kwargs: BCKwargs


class IQLPolicyConfig(StrictModel):
    type: Literal["iql"] = "iql"
    kwargs: IQLKwargs


class CQLPolicyConfig(StrictModel):
    type: Literal["cql"] = "cql"
    kwargs: CQLKwargs


ON_POLICY = ("ppo", "appo")  # env harnesses, learning from fresh fragments
OFF_POLICY = ("dqn", "sac")  # env harnesses, from a replay buffer (next_obs in fragments)
