"""Policies a suite names: a checkpoint, a run's latest checkpoint, or an ensemble of them (the mean of the
members' action distributions). Env policies are rebuilt from their run's config, as ``polar eval`` does."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import torch

from polar.agents import State, reset_state
from polar.config.run import AgentRunConfig, EnvRunConfig
from polar.errors import ConfigError, RunDirError
from polar.rollout.episodes import TensorObs

if TYPE_CHECKING:
    from polar.evaluation.suite import EvalSuite, PolicySpec
    from polar.models.policy import Policy
    from polar.trainers.run_dir import RunDir


@dataclass
class ResolvedCheckpoint:
    run_dir: RunDir
    cfg: EnvRunConfig | AgentRunConfig  # of the run that wrote it
    checkpoint: Path


def resolve_checkpoint(spec: PolicySpec, suite: EvalSuite) -> ResolvedCheckpoint:
    """The run and checkpoint file of a ``checkpoint:`` or ``run:`` policy."""
    from polar.trainers.checkpoint import CheckpointManager
    from polar.trainers.loading import resolve_target

    where = spec.checkpoint if spec.checkpoint is not None else spec.run
    if where is None:
        raise ConfigError(f"policy {spec.name!r} ({spec.kind}) names no checkpoint or run")
    path = suite.resolve(where)
    key = f"policy {spec.name!r}: {'checkpoint' if spec.checkpoint is not None else 'run'}"
    if spec.checkpoint is not None and not path.is_file():
        raise ConfigError(f"{key} {where!r} is not a file ({path}); give a checkpoint file such as "
                          "RUN/checkpoints/ckpt_00000010.pt, or use 'run: RUN' for the run's latest")
    if spec.run is not None and not path.is_dir():
        raise ConfigError(f"{key} {where!r} is not a run directory ({path})")
    run_dir, cfg, ckpt = resolve_target(path)
    if ckpt is None:
        ckpt = CheckpointManager(run_dir.checkpoints_dir).latest()
        if ckpt is None:
            raise RunDirError(f"{key}: {run_dir.path} has no checkpoint yet; nothing to evaluate")
    return ResolvedCheckpoint(run_dir, cfg, Path(ckpt))


def load_env_policy(resolved: ResolvedCheckpoint, obs_space: gym.Space[Any], act_space: gym.Space[Any]) -> Policy:
    """The checkpoint's ``Policy`` in eval mode, built for the spaces of the run's own harness."""
    from polar.models.policy import build_policy
    from polar.trainers.checkpoint import load_checkpoint

    state = load_checkpoint(resolved.checkpoint)
    if "policy" not in state:
        raise RunDirError(f"checkpoint {resolved.checkpoint} holds no env policy ('policy'); an agent run's "
                          "checkpoint is evaluated on an agent harness (kind: agent)")
    policy = build_policy(resolved.cfg, obs_space, act_space, resolved.cfg.config_dir)
    policy.load_state_dict(state["policy"])
    policy.eval()
    return policy


class EnsemblePolicy:
    """Acts with the mean of its members' action distributions.

    Discrete actions: the mean of the members' softmax probabilities (deterministic: its argmax; else a
    sample from it). Box actions: the equal-weight mixture of the members' Gaussians (deterministic: the
    mixture's mean, the mean of the members' means; else a member drawn uniformly per row, then its
    Gaussian). Members keep their own observation normalizers and recurrent states."""

    def __init__(self, members: list[Policy], names: list[str]) -> None:
        self.members, self.names = members, names
        self.agent = members[0].agent
        space = self.agent.action_space
        if not isinstance(space, (gym.spaces.Discrete, gym.spaces.Box)):
            raise ConfigError(f"ensemble of {', '.join(names)}: ensembles support Discrete and Box action spaces, "
                              f"not {space}")
        self.discrete = isinstance(space, gym.spaces.Discrete)
        for m, n in zip(members, names, strict=True):
            if m.agent.action_space != space:
                raise ConfigError(f"ensemble member {n!r} acts in {m.agent.action_space}, the first member in {space}")

    def get_initial_state(self, n: int) -> State:
        return tuple(m.agent.get_initial_state(n) for m in self.members)

    def reset_state(self, state: State, initial: State, starts: torch.Tensor) -> State:
        return tuple(reset_state(s, i, starts) for s, i in zip(state, initial, strict=True))

    def act(self, obs: TensorObs, state: State, deterministic: bool = True) -> tuple[torch.Tensor, State, dict[str, Any]]:
        infos, states = [], []
        for m, s, name in zip(self.members, state, self.names, strict=True):
            _, s2, info = m.act(obs, s, False)
            need = ("logits",) if self.discrete else ("mean", "log_std")
            if not isinstance(info, dict) or any(k not in info for k in need):
                raise ConfigError(f"ensemble member {name!r} ({type(m.agent).__name__}) returns no "
                                  f"{' and '.join(need)} in extra_info, so its action distribution cannot be averaged")
            infos.append(info)
            states.append(s2)
        if self.discrete:
            probs = torch.stack([torch.softmax(i["logits"].float(), -1) for i in infos]).mean(0)
            action = probs.argmax(-1) if deterministic else torch.multinomial(probs, 1).squeeze(-1)
            return action, tuple(states), {"probs": probs}
        means = torch.stack([i["mean"].float() for i in infos])  # [M, B, A]
        if deterministic:
            return means.mean(0), tuple(states), {}
        stds = torch.stack([i["log_std"].float().exp().expand_as(i["mean"]) for i in infos])
        pick = torch.randint(0, len(infos), (means.shape[1],))
        rows = torch.arange(means.shape[1])
        action = means[pick, rows] + torch.randn_like(means[0]) * stds[pick, rows]
        return action, tuple(states), {}
