"""Policy distillation (Rusu et al. 2016): the student's action distribution is fitted to the teacher's at the
states the student visits, by KL(teacher || student). Categorical heads compare softmaxes (the teacher's at a
temperature; a DQN teacher's Q-values are its logits), Gaussian heads use the closed-form KL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from polar.algorithms.optim import Adam, module_device
from polar.config.distill import DistillKwargs
from polar.errors import ConfigError
from polar.types import Batch, Metrics, Rollout


class ActingModule(Protocol):
    """What distillation needs of a policy: ``act`` returning the action distribution's parameters in its info."""

    def act(self, observation: Any, internal_state: Any = None, deterministic: bool = False
            ) -> tuple[torch.Tensor, Any, dict[str, torch.Tensor]]: ...

    def parameters(self) -> Any: ...


@dataclass(frozen=True)
class ActionDistribution:
    """A batch of action distributions: categorical ``logits`` ``[B, A]``, or a diagonal Gaussian ``mean`` ``[B, A]``
    with ``log_std`` (broadcast to it)."""

    logits: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    log_std: torch.Tensor | None = None


def action_distribution(info: dict[str, torch.Tensor], temperature: float = 1.0) -> ActionDistribution:
    """The distribution in an agent's ``act`` info: ``logits`` (actor-critic), ``q_values`` (DQN: softmax of
    Q / temperature), or ``mean``/``log_std`` (Gaussian actor-critic)."""
    if "logits" in info:
        return ActionDistribution(logits=info["logits"] / temperature)
    if "q_values" in info:
        return ActionDistribution(logits=info["q_values"] / temperature)
    if "mean" in info and "log_std" in info:
        return ActionDistribution(mean=info["mean"], log_std=info["log_std"].expand_as(info["mean"]))
    raise ConfigError(f"policy distill: this agent's act() gives no action distribution (info keys {sorted(info)}; "
                      "needs logits, q_values or mean/log_std); a SAC actor or a custom agent cannot be distilled")


def policy_kl(teacher: ActionDistribution, student: ActionDistribution) -> torch.Tensor:
    """KL(teacher || student) per state ``[B]``: mode-covering, so the student keeps every action the teacher
    would take. Actions the teacher gives probability 0 (masked) add nothing."""
    if teacher.logits is not None and student.logits is not None:
        logp_t = torch.log_softmax(teacher.logits, -1)
        logp_s = torch.log_softmax(student.logits, -1)
        p_t = logp_t.exp()
        return torch.where(p_t > 0, p_t * (logp_t - logp_s), torch.zeros_like(p_t)).sum(-1)
    if teacher.mean is not None and student.mean is not None:
        assert teacher.log_std is not None and student.log_std is not None
        var_t, var_s = (2 * teacher.log_std).exp(), (2 * student.log_std).exp()
        per_dim = student.log_std - teacher.log_std + (var_t + (teacher.mean - student.mean) ** 2) / (2 * var_s) - 0.5
        return per_dim.sum(-1)
    raise ConfigError("policy distill: the teacher's and the student's action heads differ (one categorical, one "
                      "Gaussian); give both the same action space")


def agreement(teacher: ActionDistribution, student: ActionDistribution) -> float:
    """Share of states where the student's most likely action is the teacher's (categorical), or minus the mean
    absolute difference of the Gaussian means (continuous: 0 is a perfect match)."""
    if teacher.logits is not None and student.logits is not None:
        return float((teacher.logits.argmax(-1) == student.logits.argmax(-1)).float().mean())
    assert teacher.mean is not None and student.mean is not None
    return -float((teacher.mean - student.mean).abs().mean())


def flat_states(rollout: Rollout) -> Any:
    """The visited observations of every fragment as one batch ``[sum T*N, ...]`` (numpy, or a dict of them)."""
    def flat(x: np.ndarray) -> np.ndarray:
        return x.reshape(-1, *x.shape[2:])

    first = rollout.fragments[0].obs
    if isinstance(first, dict):
        return {k: np.concatenate([flat(np.asarray(f.obs[k])) for f in rollout.fragments]) for k in first}
    return np.concatenate([flat(np.asarray(f.obs)) for f in rollout.fragments])


def _take(obs: Any, idx: np.ndarray, device: torch.device) -> Any:
    if isinstance(obs, dict):
        return {k: torch.as_tensor(v[idx], device=device) for k, v in obs.items()}
    return torch.as_tensor(obs[idx], device=device)


class DistillLearner:
    """``n_epochs`` passes of minibatch Adam steps on KL(teacher || student) over each rollout's states."""

    def __init__(self, student: ActingModule, teacher: ActingModule, kwargs: DistillKwargs, seed: int = 0) -> None:
        for name, agent in (("student (this run's agent)", student), ("teacher", teacher)):
            if getattr(getattr(agent, "agent", agent), "recurrent", False):
                raise ConfigError(f"policy distill: the {name} is recurrent (agent.type lstm); distillation takes "
                                  "feed-forward agents (mlp, cnn)")
        self.student, self.teacher, self.kw = student, teacher, kwargs
        self.optimizer = Adam(student.parameters(), lr=kwargs.learning_rate)
        self.rng = np.random.default_rng(seed)
        self.n_updates = 0

    def update(self, batch: Batch[Rollout]) -> Metrics:
        states = flat_states(batch.data)
        n = len(next(iter(states.values()))) if isinstance(states, dict) else len(states)
        device = module_device(self.student)  # type: ignore[arg-type]
        losses: list[float] = []
        grad = 0.0
        for _ in range(self.kw.n_epochs):
            order = self.rng.permutation(n)
            for start in range(0, n, self.kw.batch_size):
                obs = _take(states, order[start:start + self.kw.batch_size], device)
                with torch.no_grad():
                    target = action_distribution(self.teacher.act(obs, None, True)[2], self.kw.temperature)
                loss = policy_kl(target, action_distribution(self.student.act(obs, None, True)[2])).mean()
                self.optimizer.zero_grad()
                loss.backward()
                grad = float(self.optimizer.clip_grad_norm_(self.kw.max_grad_norm or float("inf")))
                self.optimizer.step()
                losses.append(float(loss.detach()))
                self.n_updates += 1
        with torch.no_grad():  # after the update, on the whole batch: how close the student now is
            obs = _take(states, np.arange(n), device)
            target = action_distribution(self.teacher.act(obs, None, True)[2], self.kw.temperature)
            now = action_distribution(self.student.act(obs, None, True)[2])
            kl_after = float(policy_kl(target, now).mean())
            agree = agreement(target, now)
        return {"distill_kl": sum(losses) / len(losses), "distill_kl_after": kl_after, "teacher_agreement": agree,
                "grad_norm": grad, "n_updates": self.n_updates}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "n_updates": self.n_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.n_updates = int(state["n_updates"])
