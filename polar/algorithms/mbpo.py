"""MBPO (Janner et al. 2019, "When to Trust Your Model: Model-Based Policy Optimization").

An ensemble of probabilistic dynamics models, each a Gaussian over ``(next_obs - obs, reward)`` given
``(obs, action)``, is fit to the real replay buffer by Gaussian negative log-likelihood with learned bounds on its
log std (PETS' soft clamp, so the predicted variance stays finite where data is thin). Every ``model_train_freq``
env steps the fit is renewed (early-stopped on a holdout, each member keeping its best epoch), the
``num_elites`` members with the lowest holdout error are kept, and ``rollout_batch_size`` real states are
branched into ``rollout_length``-step model rollouts under the current policy, each step by a random elite, into
a model buffer. SAC (``polar.algorithms.sac.SACLearner``, unchanged) then trains on batches that draw
``real_ratio`` from the real buffer and the rest from the model buffer (``polar.buffers.mixed.MixedReplay``; the
registry row hands in the model buffer and the mix, since buffers sit beside algorithms).

When a model rollout ends (``termination``): ``learned`` fits a classifier of terminal next states on the real
buffer (general, and learns "never" where nothing terminates); ``env`` uses the env's own rule, copied here for
the envs whose rule is known (``TERMINATION_RULES``); ``never`` ends none. Model rollouts are not truncated
otherwise: k is short.

What differs from the paper: the defaults are small for a CPU box (5 networks, 3 elites, 3x200 hidden, 10k
branches per round, 10 SAC steps per env step; the paper: 7, 5, 4x200, 100k, 20); one weight decay for all layers
(the paper's grows with depth); the rollout length schedule is in env steps, not epochs.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.algorithms.dqn import due_gradient_steps
from polar.algorithms.sac import SACLearner
from polar.config.mbpo import MBPOKwargs, Termination
from polar.errors import CheckpointError, ConfigError
from polar.types import Batch, Metrics, Replay, ReplaySampler, SideFile

log = logging.getLogger(__name__)

MAX_HOLDOUT = 5000  # the paper's cap on held-out transitions
MIN_GAIN = 0.01  # a member improved when its holdout error fell by more than 1%


# ---------------------------------------------------------------------- what the registry hands in
class Transitions(ReplaySampler, Protocol):
    """A replay buffer (``polar.buffers.ReplayBuffer``: buffers sit beside algorithms, so the registry row hands
    the model buffer in, and the real one arrives in each batch)."""

    def take(self, indices: np.ndarray) -> Any: ...

    def add(self, obs: Any, actions: Any, rewards: Any, next_obs: Any, terminated: Any) -> None: ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...


class MixedSampler(ReplaySampler, Protocol):
    """Batches from two buffers in a ratio (``polar.buffers.mixed.MixedReplay``), counting what it drew."""

    old: Any
    sampled_old: int
    sampled_new: int


Mix = Callable[[Transitions, Transitions, float], MixedSampler]


# ---------------------------------------------------------------------- the dynamics ensemble
class EnsembleLinear(nn.Module):  # type: ignore[misc]  # torch is read as Any (pyproject's mypy overrides)
    """E independent linear layers applied in one batched matmul: ``[E, B, in] -> [E, B, out]``."""

    def __init__(self, ensemble_size: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(ensemble_size, in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(ensemble_size, 1, out_features))
        bound = 1.0 / math.sqrt(in_features)  # nn.Linear's default init, per member
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class GaussianEnsemble(nn.Module):  # type: ignore[misc]  # torch is read as Any
    """``ensemble_size`` MLPs (SiLU, as the paper's swish) predicting a diagonal Gaussian over ``out_dim`` targets.

    Inputs are standardized with the moments of the last fit's training data (``fit_scaler``); the log std is
    softly clamped into ``[min_log_std, max_log_std]``, both learned."""

    def __init__(self, ensemble_size: int, in_dim: int, out_dim: int, hidden_sizes: list[int]) -> None:
        super().__init__()
        self.ensemble_size, self.in_dim, self.out_dim = ensemble_size, in_dim, out_dim
        sizes = [in_dim, *hidden_sizes]
        self.layers = nn.ModuleList([EnsembleLinear(ensemble_size, a, b) for a, b in itertools.pairwise(sizes)])
        self.head = EnsembleLinear(ensemble_size, sizes[-1], 2 * out_dim)
        self.max_log_std = nn.Parameter(torch.full((out_dim,), 0.25))
        self.min_log_std = nn.Parameter(torch.full((out_dim,), -5.0))
        self.register_buffer("input_mean", torch.zeros(in_dim))
        self.register_buffer("input_std", torch.ones(in_dim))

    def fit_scaler(self, inputs: torch.Tensor) -> None:
        self.input_mean.copy_(inputs.mean(0))
        self.input_std.copy_(inputs.std(0).clamp_min(1e-6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: raw inputs ``[E, B, in]`` (or ``[B, in]``, the same batch for every member). Returns the mean and
        log std, ``[E, B, out]`` each."""
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.ensemble_size, -1, -1)
        h = (x - self.input_mean) / self.input_std
        for layer in self.layers:
            h = nn.functional.silu(layer(h))
        mean, log_std = self.head(h).chunk(2, dim=-1)
        log_std = self.max_log_std - nn.functional.softplus(self.max_log_std - log_std)
        log_std = self.min_log_std + nn.functional.softplus(log_std - self.min_log_std)
        return mean, log_std

    def weights(self) -> list[nn.Parameter]:
        """The matmul weights (weight decay applies to these only)."""
        return [m.weight for m in [*self.layers, self.head]]


def gaussian_nll(mean: torch.Tensor, log_std: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-member Gaussian negative log-likelihood (without the constant), averaged over batch and dims: ``[E]``."""
    inv_var = torch.exp(-2.0 * log_std)
    return (((mean - target) ** 2) * inv_var + 2.0 * log_std).mean(dim=(1, 2))


def model_loss(model: GaussianEnsemble, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The fit's loss: the members' NLL summed, plus the paper's small pull of the log-std bounds together."""
    mean, log_std = model(inputs)
    return gaussian_nll(mean, log_std, targets).sum() + 0.01 * (model.max_log_std.sum() - model.min_log_std.sum())


# ---------------------------------------------------------------------- termination
def _hopper(o: np.ndarray) -> np.ndarray:
    z, angle = o[:, 0], o[:, 1]
    healthy: np.ndarray = np.isfinite(o).all(-1) & (np.abs(o[:, 1:]) < 100).all(-1) & (z > 0.7) & (np.abs(angle) < 0.2)
    return ~healthy


def _walker2d(o: np.ndarray) -> np.ndarray:
    z, angle = o[:, 0], o[:, 1]
    healthy: np.ndarray = (z > 0.8) & (z < 2.0) & (angle > -1.0) & (angle < 1.0)
    return ~healthy


def _ant(o: np.ndarray) -> np.ndarray:
    z = o[:, 0]
    healthy: np.ndarray = np.isfinite(o).all(-1) & (z >= 0.2) & (z <= 1.0)
    return ~healthy


def _inverted_pendulum(o: np.ndarray) -> np.ndarray:
    upright: np.ndarray = np.isfinite(o).all(-1) & (np.abs(o[:, 1]) <= 0.2)
    return ~upright


def _inverted_double_pendulum(o: np.ndarray) -> np.ndarray:
    # obs[0] is the cart x, obs[1:3] sin of the two angles, obs[3:5] their cos: the tip's y is
    # 0.6 * cos(a1) + 0.6 * cos(a1 + a2) (gymnasium's y <= 1 rule; its site sits 0.6 above each hinge)
    s1, s2, c1, c2 = o[:, 1], o[:, 2], o[:, 3], o[:, 4]
    fallen: np.ndarray = 0.6 * c1 + 0.6 * (c1 * c2 - s1 * s2) <= 1.0
    return fallen


def _mountain_car_continuous(o: np.ndarray) -> np.ndarray:
    at_goal: np.ndarray = (o[:, 0] >= 0.45) & (o[:, 1] >= 0.0)
    return at_goal


def _never(o: np.ndarray) -> np.ndarray:
    return np.zeros(len(o), bool)


# gymnasium's rules on the observation after the step, for the envs' default kwargs (env name without version)
TERMINATION_RULES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Hopper": _hopper, "Walker2d": _walker2d, "Ant": _ant, "InvertedPendulum": _inverted_pendulum,
    "InvertedDoublePendulum": _inverted_double_pendulum, "MountainCarContinuous": _mountain_car_continuous,
    "Pendulum": _never, "HalfCheetah": _never, "Swimmer": _never, "Reacher": _never, "Pusher": _never,
}
# harness kwargs that change what terminates (a copied rule would be wrong)
_RULE_KWARGS = ("healthy", "terminate_when_unhealthy", "exclude_current_positions", "goal_velocity",
                "include_cfrc_ext")


def termination_rule(env_id: str | None, env_kwargs: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    """The env's own termination rule on next observations (``termination: env``), or a ConfigError naming why not."""
    name = (env_id or "").split("/")[-1].split("-v")[0]
    rule = TERMINATION_RULES.get(name)
    if rule is None:
        known = ", ".join(sorted(TERMINATION_RULES))
        raise ConfigError(f"policy.kwargs.termination: env: polar knows the termination rule of {known}, not of "
                          f"harness {env_id!r}; use termination: learned (or never, if its episodes only end by "
                          "time limit)")
    changed = sorted(k for k in env_kwargs if any(k.startswith(p) for p in _RULE_KWARGS))
    if changed and rule is not _never:
        raise ConfigError(f"policy.kwargs.termination: env copies {name}'s rule for its default kwargs, but "
                          f"harness.kwargs sets {', '.join(changed)}; use termination: learned")
    return rule


class TerminationClassifier(nn.Module):  # type: ignore[misc]  # torch is read as Any
    """P(terminated | next_obs): an MLP on standardized next observations, fit with the model (``learned``)."""

    def __init__(self, obs_dim: int, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, 1))
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))

    def forward(self, next_obs: torch.Tensor) -> torch.Tensor:
        return self.net((next_obs - self.obs_mean) / self.obs_std).squeeze(-1)


# ---------------------------------------------------------------------- the learner
def check_mbpo_spaces(observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> tuple[int, int]:
    """(obs_dim, action_dim): MBPO models flat Box observations and Box actions."""
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        raise ConfigError(f"policy.type mbpo learns a dynamics model of flat (1-D) Box observations; this env's are "
                          f"{observation_space}. Flatten them with a wrapper, or train with policy.type: sac")
    if not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(f"policy.type mbpo needs a Box (continuous) action space, as SAC does; this env's is "
                          f"{action_space}")
    return int(observation_space.shape[0]), int(np.prod(action_space.shape))


class MBPOLearner:
    """SAC's learner plus the dynamics ensemble, its termination, and the model buffer; ``update`` refits and rolls
    out when due, then runs SAC's gradient steps on the mixed batch."""

    def __init__(self, agent: nn.Module, kwargs: MBPOKwargs, make_critic: Callable[[], nn.Module],
                 observation_space: gym.Space[Any], action_space: gym.Space[Any], total_env_steps: int,
                 model_replay: Transitions, mix: Mix, checkpoint_dir: Path, env_id: str | None = None,
                 env_kwargs: dict[str, Any] | None = None) -> None:
        """``model_replay``: the model buffer (``kwargs.model_buffer_size`` transitions); ``mix(real, model,
        real_ratio)``: SAC's sampler over both."""
        obs_dim, act_dim = check_mbpo_spaces(observation_space, action_space)
        self.kw = kwargs
        self.agent = agent
        self.checkpoint_dir = checkpoint_dir
        self.sac = SACLearner(agent, kwargs, make_critic, action_space, total_env_steps)
        self.device = self.sac.device
        self.model = GaussianEnsemble(kwargs.ensemble_size, obs_dim + act_dim, obs_dim + 1,
                                      kwargs.model_hidden_sizes).to(self.device)
        decay = set(map(id, self.model.weights()))
        self.model_optimizer = torch.optim.Adam([
            {"params": self.model.weights(), "weight_decay": kwargs.model_weight_decay},
            {"params": [p for p in self.model.parameters() if id(p) not in decay], "weight_decay": 0.0},
        ], lr=kwargs.model_learning_rate)
        self.elites = torch.arange(kwargs.num_elites)
        self.termination: Termination = kwargs.termination
        self.rule: Callable[[np.ndarray], np.ndarray] | None = None
        self.classifier: TerminationClassifier | None = None
        self.classifier_optimizer: torch.optim.Adam | None = None
        if kwargs.termination == "env":
            self.rule = termination_rule(env_id, env_kwargs or {})
        elif kwargs.termination == "never":
            self.rule = _never
        else:
            self.classifier = TerminationClassifier(obs_dim).to(self.device)
            self.classifier_optimizer = torch.optim.Adam(self.classifier.parameters(), lr=kwargs.model_learning_rate)
        self.model_replay = model_replay
        self.mix = mix
        self.last_fit: int | None = None  # run env steps at the last fit
        self.fits = 0
        self.model_stats: Metrics = {}
        self.mixed: MixedSampler | None = None  # SAC's sampler: real_ratio from the real buffer, the rest model data

    def set_exploration(self, env_steps: int) -> None:
        self.sac.set_exploration(env_steps)

    # ---- the model -------------------------------------------------------------------------------------
    def fit_model(self, real: Transitions) -> Metrics:
        """Refit the ensemble (and the termination classifier) on every real transition; pick the elites."""
        kw, model = self.kw, self.model
        start = time.perf_counter()
        data = real.take(np.arange(len(real))).to(self.device)
        assert isinstance(data.obs, torch.Tensor) and isinstance(data.next_obs, torch.Tensor)  # check_mbpo_spaces
        obs, next_obs = data.obs.float(), data.next_obs.float()
        actions = data.actions.float().reshape(len(obs), -1)
        inputs = torch.cat([obs, actions], -1)
        targets = torch.cat([next_obs - obs, data.rewards.float().unsqueeze(-1)], -1)
        n = len(inputs)
        n_holdout = min(MAX_HOLDOUT, int(n * kw.model_holdout_ratio)) if n >= 2 else 0
        perm = torch.randperm(n, device=self.device)
        hold, train = perm[:n_holdout], perm[n_holdout:]
        model.fit_scaler(inputs[train])
        E, B = kw.ensemble_size, kw.model_batch_size
        best = torch.full((E,), math.inf)  # every member takes its first epoch (the scaler just changed)
        members = [k for k in model.state_dict() if k.startswith(("layers.", "head."))]  # first axis: the member
        best_state = {k: v.detach().clone() for k, v in model.state_dict().items() if k in members}
        since_gain, epochs, nll = 0, 0, float("nan")
        while epochs < kw.model_max_epochs:
            epochs += 1
            order = torch.stack([train[torch.randperm(len(train), device=self.device)] for _ in range(E)])
            total, batches = 0.0, 0
            for i in range(0, len(train), B):
                idx = order[:, i:i + B]
                loss = model_loss(model, inputs[idx], targets[idx])
                self.model_optimizer.zero_grad()
                loss.backward()
                self.model_optimizer.step()
                total, batches = total + float(loss.detach()) / E, batches + 1
            nll = total / max(1, batches)
            if not n_holdout:
                continue
            mse = self._holdout_mse(inputs[hold], targets[hold])
            gained = torch.isinf(best) | ((best - mse) / best.clamp_min(1e-12) > MIN_GAIN)
            if bool(gained.any()):
                state = model.state_dict()
                for key in members:  # each member keeps its best epoch's weights
                    best_state[key][gained] = state[key][gained].detach().clone()
                best = torch.where(gained, mse, best)
                since_gain = 0
            else:
                since_gain += 1
                if since_gain >= kw.model_patience:
                    break
        if n_holdout:
            model.load_state_dict({**model.state_dict(), **best_state})
        self.elites = torch.argsort(best)[:kw.num_elites].cpu()
        if self.classifier is not None:
            self._fit_classifier(next_obs, data.terminated.float())
        self.fits += 1
        elite_mse = best[self.elites]
        return {"model/nll": nll, "model/holdout_mse": float(elite_mse.mean()) if n_holdout else float("nan"),
                "model/epochs": epochs, "model/fit_s": time.perf_counter() - start, "model/fits": self.fits,
                "model/train_transitions": len(train)}

    def _holdout_mse(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            mean, _ = self.model(inputs)
            return ((mean - targets) ** 2).mean(dim=(1, 2)).cpu()

    def _fit_classifier(self, next_obs: torch.Tensor, terminated: torch.Tensor) -> None:
        """BCE on every real next state, terminal ones weighted up to balance the classes (they are rare)."""
        clf, opt = self.classifier, self.classifier_optimizer
        assert clf is not None and opt is not None
        clf.obs_mean.copy_(next_obs.mean(0))
        clf.obs_std.copy_(next_obs.std(0).clamp_min(1e-6) if len(next_obs) > 1 else torch.ones_like(clf.obs_std))
        positives = float(terminated.sum())
        pos_weight = torch.tensor((len(terminated) - positives) / positives if positives else 1.0, device=self.device)
        n, B = len(next_obs), self.kw.model_batch_size
        for _ in range(self.kw.model_max_epochs):
            perm = torch.randperm(n, device=self.device)
            for i in range(0, n, B):
                idx = perm[i:i + B]
                loss = nn.functional.binary_cross_entropy_with_logits(clf(next_obs[idx]), terminated[idx],
                                                                      pos_weight=pos_weight)
                opt.zero_grad()
                loss.backward()
                opt.step()

    def terminated(self, next_obs: torch.Tensor) -> torch.Tensor:
        """Which model next states end their rollout (``termination``)."""
        with torch.no_grad():
            if self.classifier is not None:
                return self.classifier(next_obs) > 0.0  # P > 0.5
            assert self.rule is not None
            return torch.as_tensor(self.rule(next_obs.cpu().numpy()), device=next_obs.device)

    def predict(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One model step: a random elite per row samples (next_obs, reward) from its Gaussian."""
        with torch.no_grad():
            mean, log_std = self.model(torch.cat([obs, actions.reshape(len(obs), -1)], -1))
            pick = self.elites[torch.randint(len(self.elites), (len(obs),))].to(self.device)
            rows = torch.arange(len(obs), device=self.device)
            sample = mean[pick, rows] + log_std[pick, rows].exp() * torch.randn_like(mean[0])
            return obs + sample[:, :-1], sample[:, -1]

    def rollout(self, real: Transitions, length: int) -> Metrics:
        """Branch ``rollout_batch_size`` real states into ``length``-step model rollouts under the current policy
        (sampled actions, as it acts while training); each step's transitions go to the model buffer."""
        with torch.no_grad():
            obs = real.sample(self.kw.rollout_batch_size).obs
            assert isinstance(obs, torch.Tensor)
            obs = obs.float().to(self.device)
            added, steps, ended = 0, 0, 0
            for _ in range(length):
                actions, _ = self.agent.sample(obs)
                next_obs, rewards = self.predict(obs, actions)
                done = self.terminated(next_obs)
                self.model_replay.add(obs.cpu().numpy(), actions.cpu().numpy(), rewards.cpu().numpy(),
                                      next_obs.cpu().numpy(), done.float().cpu().numpy())
                added, steps, ended = added + len(obs), steps + 1, ended + int(done.sum())
                obs = next_obs[~done]
                if not len(obs):
                    break
            return {"rollout/length": length, "rollout/steps": steps, "rollout/added": added,
                    "rollout/terminated": ended, "model_replay_size": len(self.model_replay)}

    # ---- the Learner -----------------------------------------------------------------------------------
    def update(self, batch: Batch[Replay]) -> Metrics:
        """A model fit and a rollout round every ``model_train_freq`` env steps from ``learning_starts`` on, then
        SAC's gradient steps (``due_gradient_steps``) on batches of ``real_ratio`` real and the rest model data."""
        kw, env_steps = self.kw, batch.run_env_steps
        if not hasattr(batch.data.sampler, "take"):  # replay_mix's sampler (the config refuses it)
            raise ConfigError("policy.type mbpo samples the run's own replay buffer; replay_mix is not supported")
        real = cast(Transitions, batch.data.sampler)
        stats: Metrics = {}
        due = self.last_fit is None or env_steps - self.last_fit >= kw.model_train_freq
        if env_steps >= kw.learning_starts and len(real) > 0 and due:
            self.model_stats = self.fit_model(real)
            self.model_stats.update(self.rollout(real, kw.rollout_length_at(env_steps)))
            self.last_fit = env_steps
        steps = due_gradient_steps(kw, len(real), env_steps, batch.env_steps)
        if steps:
            if self.mixed is None or self.mixed.old is not real:
                self.mixed = self.mix(real, self.model_replay, kw.real_ratio)
            stats.update(self.sac.train(self.mixed, steps, env_steps))
            sampled = self.mixed.sampled_old + self.mixed.sampled_new
            stats["real_fraction"] = self.mixed.sampled_old / sampled  # of SAC's transitions since this start
        self.sac.set_exploration(env_steps)
        return {**stats, **self.model_stats}

    def state_dict(self) -> dict[str, Any]:
        buffer = SideFile("model_replay", "npz", self.model_replay.save) if self.kw.save_replay_buffer else None
        return {
            "sac_learner": self.sac.state_dict(),
            "model": self.model.state_dict(),
            "model_optimizer": self.model_optimizer.state_dict(),
            "elites": self.elites.clone(),
            "classifier": None if self.classifier is None else self.classifier.state_dict(),
            "classifier_optimizer": None if self.classifier_optimizer is None else self.classifier_optimizer.state_dict(),
            "last_fit": self.last_fit,
            "fits": self.fits,
            "model_replay_file": buffer,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sac.load_state_dict(state["sac_learner"])
        self.model.load_state_dict(state["model"])
        self.model_optimizer.load_state_dict(state["model_optimizer"])
        self.elites = state["elites"].clone()
        if self.classifier is not None and self.classifier_optimizer is not None:
            if state.get("classifier") is None:
                raise CheckpointError("this checkpoint has no termination classifier (it was written with "
                                      "policy.kwargs.termination env or never); resume with the same termination")
            self.classifier.load_state_dict(state["classifier"])
            self.classifier_optimizer.load_state_dict(state["classifier_optimizer"])
        self.last_fit = None if state["last_fit"] is None else int(state["last_fit"])
        self.fits = int(state["fits"])
        name = state.get("model_replay_file")
        if not name:
            log.warning("this checkpoint has no model buffer (save_replay_buffer was off): it refills at the next "
                        "rollout round")
            return
        path = self.checkpoint_dir / str(name)
        if not path.is_file():
            raise CheckpointError(f"checkpoint names model buffer {path}, which is missing; restore the file, or "
                                  "resume from an earlier checkpoint")
        self.model_replay.load(path)
