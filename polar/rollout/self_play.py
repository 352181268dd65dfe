"""Self-play's opponent pool: frozen snapshots of the learning policy, sampled by a stated rule.

Each game the collector asks ``sample()`` for the opponent of the learner's seat: ``None`` (the current policy
itself, ``latest_share`` of the games, and every game while the pool is empty), or a snapshot, drawn

- ``uniform``: every snapshot alike;
- ``win_rate``: in proportion to the snapshot's smoothed score against the learner,
  ``(wins + draws / 2 + 1) / (games + 2)``, so the opponents the learner still loses to come up more often.

Snapshots are frozen: they act, they never learn. The pool (weights and scores) is part of the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from polar.config.multi_agent import SelfPlayConfig

Result = Literal["win", "draw", "loss"]


@dataclass
class Snapshot:
    """A frozen copy of the learner; ``wins``/``draws``/``losses`` are the snapshot's, against the learner."""

    snapshot_id: int
    iteration: int
    policy: Any  # a polar.models.Policy, in eval mode
    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    def score(self) -> float:
        return (self.wins + 0.5 * self.draws + 1.0) / (self.games + 2.0)


class OpponentPool:
    def __init__(self, cfg: SelfPlayConfig, make_policy: Callable[[], Any], seed: int) -> None:
        self.cfg = cfg
        self.make_policy = make_policy  # a fresh Policy of the learner's architecture
        self.rng = np.random.default_rng(seed)
        self.snapshots: list[Snapshot] = []
        self.next_id = 0

    def add(self, state_dict: dict[str, torch.Tensor], iteration: int) -> Snapshot:
        """A frozen copy of ``state_dict`` joins; the oldest leaves once there are ``pool_size``."""
        policy = self.make_policy()
        policy.load_state_dict({k: v.detach().clone() for k, v in state_dict.items()})
        policy.eval()
        for p in policy.parameters():
            p.requires_grad_(False)
        snap = Snapshot(self.next_id, iteration, policy)
        self.next_id += 1
        self.snapshots.append(snap)
        del self.snapshots[:-self.cfg.pool_size]
        return snap

    def weights(self) -> np.ndarray:
        """Each snapshot's chance of being drawn when a pool opponent is drawn."""
        if self.cfg.sampling == "win_rate":
            w = np.array([s.score() for s in self.snapshots])
        else:
            w = np.ones(len(self.snapshots))
        return w / w.sum()

    def sample(self) -> Snapshot | None:
        """The next game's opponent: None for the current policy, else a snapshot."""
        if not self.snapshots or self.rng.random() < self.cfg.latest_share:
            return None
        return self.snapshots[int(self.rng.choice(len(self.snapshots), p=self.weights()))]

    def record(self, snapshot_id: int, learner_result: Result) -> None:
        for s in self.snapshots:
            if s.snapshot_id == snapshot_id:
                if learner_result == "win":
                    s.losses += 1
                elif learner_result == "loss":
                    s.wins += 1
                else:
                    s.draws += 1

    def metrics(self) -> dict[str, float]:
        games = sum(s.games for s in self.snapshots)
        learner_wins = sum(s.losses for s in self.snapshots)
        return {"self_play/pool_size": float(len(self.snapshots)),
                "self_play/train_win_rate_vs_pool": learner_wins / games if games else float("nan")}

    def state_dict(self) -> dict[str, Any]:
        return {"next_id": self.next_id, "rng": self.rng.bit_generator.state,
                "snapshots": [{"snapshot_id": s.snapshot_id, "iteration": s.iteration, "wins": s.wins, "draws": s.draws,
                               "losses": s.losses, "policy": s.policy.state_dict()} for s in self.snapshots]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.snapshots = []
        for d in state["snapshots"]:
            snap = self.add(d["policy"], int(d["iteration"]))
            snap.snapshot_id, snap.wins, snap.draws, snap.losses = (int(d["snapshot_id"]), int(d["wins"]),
                                                                    int(d["draws"]), int(d["losses"]))
        self.next_id = int(state["next_id"])
        self.rng.bit_generator.state = state["rng"]
