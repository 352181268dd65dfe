"""``harness: {type: pettingzoo}``: a PettingZoo AEC or Parallel env, which policy plays which agent, and self-play.

- ``id``: a PettingZoo module (``pettingzoo.classic.tictactoe_v3``: its ``env()`` is called) or ``module:function``
  returning an AEC or Parallel env; ``env_kwargs`` are passed to it.
- or ``connector_spec``: a multi-agent connector, a game in any language speaking the connector protocol's
  multi-agent messages (docs/connector-protocol.md section 7).
- ``policy_mapping``: agent id -> policy name. Empty: every agent plays one shared policy (parameter sharing).
  Agents mapped to one name share its parameters and are batched together when acting.
- ``self_play``: the learning policy plays against frozen past copies of itself (docs/multi-agent.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from polar.config.base import StrictModel
from polar.config.harness import ConnectorSpec

SHARED_POLICY = "shared"


class SelfPlayConfig(StrictModel):
    """An opponent pool of frozen snapshots of the learning policy; each game seats the learner at one random
    agent and fills the other seats from the pool (or with the learner itself, ``latest_share`` of the games)."""

    pool_size: int = Field(8, ge=1, description="snapshots kept; the oldest goes first")
    snapshot_every_n_iterations: int = Field(5, ge=1, description="a frozen copy of the learner joins the pool this often")
    sampling: Literal["uniform", "win_rate"] = Field(
        "uniform", description="uniform over the pool, or prioritised by the opponent's win rate against the learner "
        "(weight: its wins + draws/2 + 1, over its games + 2)")
    latest_share: float = Field(0.5, ge=0.0, le=1.0, description="share of games against the current policy (both seats "
                                "learn); with an empty pool every game is")
    random_share: float = Field(0.0, ge=0.0, le=1.0, description="share of games whose other seats a uniformly random "
                                "legal player takes (not self-play: off by default; docs/multi-agent.md)")
    opponent_noise: float = Field(0.0, ge=0.0, le=1.0, description="per move, the probability that a pool opponent "
                                  "plays a uniformly random legal move instead of its own: the learner meets the "
                                  "positions an erring player makes, in games that stay self-play (off by default)")
    seat_sampling: Literal["uniform", "win_rate"] = Field(
        "uniform", description="the learner's seat in a game against the pool or a random player: uniform over the "
        "agents, or prioritised by the learner's recent results at each seat (weight: its losses + draws/2 + 1, over "
        "its games + 2, counted over about its last 100 games there), so the seat it does worse at comes up more often")
    eval_games: int = Field(100, ge=1, description="games against the pool and against a random player at each evaluation")


class PettingZooHarnessConfig(StrictModel):
    type: Literal["pettingzoo"] = "pettingzoo"
    id: str | None = Field(None, description="a PettingZoo module (pettingzoo.classic.tictactoe_v3) or module:function")
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    connector_spec: ConnectorSpec | None = Field(
        None, description="instead of id: a multi-agent connector (docs/connector-protocol.md section 7)")
    policy_mapping: dict[str, str] = Field(
        default_factory=dict, description=f"agent id -> policy name; empty: all agents share one policy ({SHARED_POLICY!r})")
    self_play: SelfPlayConfig | None = Field(None, description="train against a pool of frozen past snapshots")

    @model_validator(mode="after")
    def _one_env(self) -> PettingZooHarnessConfig:
        if (self.id is None) == (self.connector_spec is None):
            raise ValueError("harness: give id (a PettingZoo env) or connector_spec (a multi-agent connector), one "
                             "of them")
        if self.connector_spec is not None and self.env_kwargs:
            raise ValueError("harness.env_kwargs: a connector takes its settings in connector_spec.config")
        return self
