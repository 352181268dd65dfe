"""The PPO update setup the PPO tests share: one real rollout of a config, the batch the loop hands
``PPOLearner.update``, and the gradient of every optimizer step of one update."""

from __future__ import annotations

from typing import Any

import torch

from polar.algorithms.ppo import PPOLearner
from polar.buffers.rollout_buffer import RolloutBuffer
from polar.config import EnvRunConfig
from polar.models.policy import build_policy
from polar.rollout.backends.base import make_backend
from polar.types import Batch, Fragment, Rollout

DEFAULT = {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"}}


def one_rollout(cfg: EnvRunConfig) -> tuple[Any, Fragment]:
    """The policy ``cfg`` builds (seeded 0) and one real rollout of it, its envs stepped in this process."""
    from polar.trainers.registry import algorithm

    steps_per_env = algorithm(cfg).steps_per_env
    assert steps_per_env is not None  # an on-policy row
    torch.manual_seed(0)
    backend = make_backend(cfg, steps_per_env(cfg), seed=0)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    try:
        backend.start(policy.state_dict(), 0, policy=policy)
        frag = backend.next_fragment()
    finally:
        backend.close()
    return policy, frag


def rollout_batch(frag: Fragment, first_iteration: bool = False) -> Batch[Rollout]:
    """``frag`` as ``PPOLearner.update`` takes it: at progress 0, or stamped as the loop's first iteration."""
    if first_iteration:
        return Batch(data=Rollout([frag], buffer=RolloutBuffer([frag])), env_steps=frag.env_steps,
                     run_env_steps=frag.env_steps, iteration=1)
    return Batch(data=Rollout([frag], buffer=RolloutBuffer([frag])), env_steps=frag.env_steps)


def update_grads(default_rollout: tuple[EnvRunConfig, Any, dict[str, torch.Tensor], Fragment],
                 fused: str = "auto") -> tuple[PPOLearner, list[torch.Tensor]]:
    """The gradient of every optimizer step of one PPO update of ``default_rollout`` (config, policy, initial
    weights, fragment) from its initial weights, with a fixed minibatch order."""
    cfg, policy, initial, frag = default_rollout
    policy.load_state_dict(initial)
    learner = PPOLearner(policy.agent, cfg.policy.kwargs.model_copy(update={"fused": fused}), cfg.total_env_steps)
    grads: list[torch.Tensor] = []
    step = learner.optimizer.step

    def recording_step() -> None:
        grads.append(torch.cat([p.grad.reshape(-1) for p in learner.params]).clone())
        step()

    learner.optimizer.step = recording_step  # type: ignore[method-assign]
    torch.manual_seed(1)  # the same minibatch order every time
    learner.update(rollout_batch(frag))
    return learner, grads
