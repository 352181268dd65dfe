"""``AgentBase``: the contract between a policy network and everything that runs or trains it.

An agent maps a *batch* of observations to a batch of actions::

    action, new_internal_state, extra_info = agent.act(observation, internal_state=None, deterministic=False)

- ``observation``: a tensor ``[B, ...]``, or a dict of them for Dict spaces.
- ``internal_state``: whatever ``get_initial_state(B)`` returned (None for feed-forward agents): a tensor
  or a tuple of tensors, batch first. Recurrent agents return the next state.
- ``extra_info``: what the algorithm needs. PPO reads ``values`` (``[B]``) and the distribution
  parameters: ``logits`` for Discrete/MultiDiscrete, ``mean`` and ``log_std`` for Box. ``log_prob`` is
  optional (computed from the parameters when absent).

Training calls ``evaluate_actions``; the default re-runs ``act`` with gradients and reads the same
``extra_info``, so a user's agent needs only ``act`` (keep the tensors attached: do not ``detach()``).
Built-in agents override it with a faster path.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.errors import AgentError

State = Any  # None | Tensor | tuple[Tensor, ...], batch first


def map_state(fn, state: State) -> State:
    """Apply ``fn`` to every tensor of an internal state (None, a tensor or a tuple/list of tensors)."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return fn(state)
    if isinstance(state, (tuple, list)):
        return type(state)(map_state(fn, s) for s in state)
    if isinstance(state, dict):
        return {k: map_state(fn, v) for k, v in state.items()}
    raise AgentError(f"internal_state must be None, a tensor, or a tuple/dict of tensors; got {type(state).__name__}")


def reset_state(state: State, initial: State, starts: torch.Tensor) -> State:
    """Where ``starts[b]`` is true, replace row ``b`` of ``state`` by the initial state."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        mask = starts.reshape(-1, *([1] * (state.dim() - 1))).to(state.dtype)
        return state * (1 - mask) + initial * mask
    if isinstance(state, (tuple, list)):
        return type(state)(reset_state(s, i, starts) for s, i in zip(state, initial, strict=True))
    return {k: reset_state(state[k], initial[k], starts) for k in state}


class AgentBase(nn.Module):
    """Base class for every agent, built-in or user-written. Subclass it and implement ``act``.

    After construction polar sets ``observation_space`` and ``action_space`` (the single-env spaces).
    """

    observation_space: gym.Space | None = None
    action_space: gym.Space | None = None

    def act(self, observation: Any, internal_state: State = None, deterministic: bool = False):
        raise NotImplementedError(f"{type(self).__name__} must implement act(observation, internal_state, deterministic)")

    def get_initial_state(self, batch_size: int = 1) -> State:
        """The internal state at an episode start, batch first. None for feed-forward agents."""
        return None

    # --- used by polar; rarely overridden --------------------------------------------------------
    def bind_spaces(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space = observation_space
        self.action_space = action_space

    @property
    def action_dist(self):
        from polar.distributions import dist_for_space

        dist = self.__dict__.get("_polar_dist")
        if dist is None:
            if self.action_space is None:
                raise AgentError(f"{type(self).__name__}: action_space is not bound; call bind_spaces() first")
            dist = dist_for_space(self.action_space)
            self.__dict__["_polar_dist"] = dist
        return dist

    def evaluate_actions(self, observation: Any, actions: torch.Tensor, internal_state: State = None, episode_starts=None):
        """Log-prob of ``actions``, entropy and value under the current parameters (with gradients).

        Feed-forward: ``observation`` is ``[N, ...]``. Recurrent (``internal_state`` given): ``[T, B, ...]``
        sequences starting from ``internal_state``, reset to the initial state where ``episode_starts``.
        """
        dist = self.action_dist
        if internal_state is None:
            _, _, info = self.act(observation, None, deterministic=False)
            return self._read_info(info, actions, dist)
        steps = actions.shape[0]
        batch = actions.shape[1]
        initial = self.get_initial_state(batch)
        state = internal_state
        logps, ents, vals = [], [], []
        for t in range(steps):
            state = reset_state(state, initial, episode_starts[t])
            obs_t = {k: v[t] for k, v in observation.items()} if isinstance(observation, dict) else observation[t]
            _, state, info = self.act(obs_t, state, deterministic=False)
            lp, en, va = self._read_info(info, actions[t], dist)
            logps.append(lp)
            ents.append(en)
            vals.append(va)
        return torch.stack(logps), torch.stack(ents), torch.stack(vals)

    def _read_info(self, info: dict, actions: torch.Tensor, dist):
        owner = type(self).__name__
        if not isinstance(info, dict):
            raise AgentError(f"{owner}.act() must return extra_info as a dict, got {type(info).__name__}")
        dist.check(info, owner)
        values = info.get("values", info.get("value"))
        if values is None:
            raise AgentError(f"{owner}.act() returned extra_info without 'values'; PPO needs a value head (keys: {sorted(info)}).")
        values = torch.as_tensor(values)
        if values.dim() == 2 and values.shape[-1] == 1:
            values = values.squeeze(-1)
        if not values.requires_grad and torch.is_grad_enabled():
            raise AgentError(
                f"{owner}.act() returned detached 'values'/'logits' (no gradient); return them attached so PPO can "
                "train the agent, or override evaluate_actions()."
            )
        return dist.log_prob(info, actions), dist.entropy(info), values


def check_act_output(agent: AgentBase, action: Any, batch_size: int, action_space: gym.Space) -> np.ndarray:
    """Convert an agent's action batch to numpy; raise ``AgentError`` naming the agent on a wrong shape."""
    if isinstance(action, torch.Tensor):
        arr = action.detach().cpu().numpy()
    else:
        arr = np.asarray(action)
    expected = (batch_size, *action_space.shape)
    if arr.shape != expected:
        if isinstance(action_space, gym.spaces.Discrete) and arr.shape == (batch_size, 1):
            arr = arr.reshape(batch_size)
        elif isinstance(action_space, gym.spaces.Box) and arr.size == int(np.prod(expected)):
            arr = arr.reshape(expected)
        else:
            raise AgentError(
                f"{type(agent).__name__}.act() returned actions of shape {tuple(arr.shape)}, expected {expected} "
                f"(batch of {batch_size} for action space {action_space}). act() works on a batch: return one action per row."
            )
    return arr
