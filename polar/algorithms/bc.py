"""Behaviour cloning for classic agents: maximum likelihood of a dataset's actions under the agent's own
action distribution (categorical or Gaussian head), so ``deterministic`` acting takes its mode."""

from __future__ import annotations

from typing import Any

import torch

from polar.algorithms.optim import Adam
from polar.types import Batch


def bc_loss(log_prob: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Negative log-likelihood of the dataset's actions (weighted: advantage-weighted regression)."""
    return -(log_prob if weights is None else weights * log_prob).mean()


class OfflineBatch:
    """One minibatch of transitions as tensors (``polar.rollout.dataset.DatasetCollector`` samples them)."""

    def __init__(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
                 terminated: torch.Tensor) -> None:
        self.obs, self.actions, self.rewards, self.next_obs, self.terminated = obs, actions, rewards, next_obs, terminated


class BCLearner:
    """One Adam step of :func:`bc_loss` per minibatch."""

    def __init__(self, agent: Any, kwargs: Any) -> None:
        self.agent = agent
        self.kw = kwargs
        self.optimizer = Adam(agent.parameters(), lr=kwargs.learning_rate)
        self.n_updates = 0

    def _actor_step(self, loss: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss.backward()
        grad = self.optimizer.clip_grad_norm_(self.kw.max_grad_norm or float("inf"))
        self.optimizer.step()
        return float(grad)

    def update(self, batch: Batch[list[OfflineBatch]]) -> dict[str, Any]:
        batches = batch.data
        losses, ents = [], []
        grad = 0.0
        for b in batches:
            log_prob, entropy, _ = self.agent.evaluate_actions(b.obs, b.actions)
            loss = bc_loss(log_prob)
            grad = self._actor_step(loss)
            losses.append(float(loss.detach()))
            ents.append(float(entropy.detach().mean()))
            self.n_updates += 1
        return {"bc_loss": sum(losses) / len(losses), "entropy": sum(ents) / len(ents), "grad_norm": grad,
                "n_updates": self.n_updates}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "n_updates": self.n_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.n_updates = int(state["n_updates"])
