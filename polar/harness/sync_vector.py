"""polar's in-process vector env: ``gymnasium.vector.SyncVectorEnv(autoreset_mode=SAME_STEP)``, with less work per step.

``SameStepVectorEnv.step`` returns what Gymnasium's ``SyncVectorEnv`` returns with SAME_STEP autoreset and its
default ``copy=True`` (observations, rewards, terminations, truncations and infos, ``final_obs``/``final_info``
and the ``_key`` masks included, dict keys in the same order), and calls each sub-env's ``step``/``reset`` with
the same arguments in the same order; it skips what does not change the result:

- fixed-shape observations (``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``, and ``Dict``/``Tuple``
  of them) are stacked into a new array once, not concatenated into a buffer and then deep-copied; other
  spaces (``Text``, ``Graph``, ...) go through Gymnasium's ``concatenate`` as before;
- rewards and flags are gathered in Python lists and turned into arrays once per step;
- when no sub-env returned an info key in a step (CartPole, most classic-control envs), the infos dict is
  built directly: ``{}``, or the four ``final_obs``/``final_info`` entries of the envs whose episode ended.
  Any info key sends the step through Gymnasium's own ``_add_info`` sequence.

Everything else (construction, space checks, ``reset``, ``call``, ``get_attr``, ``set_attr``, ``render``,
``close``) is ``SyncVectorEnv``'s. ``tests/harness/test_sync_vector.py`` compares the two step for step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Space, Tuple
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import concatenate, iterate

__all__ = ["SameStepVectorEnv"]

Stack = Callable[[list[Any]], Any]

# Gymnasium's own dispatch targets: a space class that registers its own concatenate/iterate keeps it.
_CONCATENATE_ARRAY = concatenate.dispatch(Box)
_CONCATENATE_DICT = concatenate.dispatch(Dict)
_CONCATENATE_TUPLE = concatenate.dispatch(Tuple)
_ITERATE_ARRAY = iterate.dispatch(Box)


def _array_stack(space: Space[Any], num_envs: int) -> Stack:
    """``concatenate(space, items, out)`` then ``deepcopy`` for an array space: one new array.

    ``np.array(items)`` is the fast path; when it gives another dtype or shape (an env returning float64 for
    a float32 Box, a list, ragged items) ``np.stack(..., out=)`` casts or raises exactly as ``concatenate``."""
    assert space.shape is not None and space.dtype is not None  # array spaces have both
    shape, dtype = (num_envs, *space.shape), space.dtype

    def stack(items: list[Any]) -> np.ndarray:
        try:
            out = np.array(items)
        except ValueError:  # ragged: np.stack says why
            out = None
        if out is None or out.dtype != dtype or out.shape != shape:
            out = np.stack(items, axis=0, out=np.empty(shape, dtype))
        return out

    return stack


def _stacker(space: Space[Any], num_envs: int) -> Stack | None:
    """A function from the sub-envs' observations to the batch ``SyncVectorEnv`` returns, or None where
    only Gymnasium's generic ``concatenate`` knows (``Text``, ``Graph``, ``Sequence``, custom spaces)."""
    how = concatenate.dispatch(type(space))
    if how is _CONCATENATE_ARRAY and isinstance(space, Box | Discrete | MultiDiscrete | MultiBinary):
        return _array_stack(space, num_envs)
    if how is _CONCATENATE_DICT and isinstance(space, Dict):
        parts = {key: _stacker(sub, num_envs) for key, sub in space.spaces.items()}
        if any(p is None for p in parts.values()):
            return None
        dict_parts: dict[str, Stack] = {k: p for k, p in parts.items() if p is not None}
        return lambda items: {key: part([item[key] for item in items]) for key, part in dict_parts.items()}
    if how is _CONCATENATE_TUPLE and isinstance(space, Tuple):
        subs = [_stacker(sub, num_envs) for sub in space.spaces]
        if any(p is None for p in subs):
            return None
        tuple_parts: list[Stack] = [p for p in subs if p is not None]
        return lambda items: tuple(part([item[j] for item in items]) for j, part in enumerate(tuple_parts))
    return None


def _per_env(values: list[Any], dtype: type[np.generic]) -> np.ndarray:
    """``values`` as ``SyncVectorEnv``'s per-env array of ``dtype`` (float64 rewards, bool flags), element by
    element where they are not scalars."""
    out = np.array(values, dtype)
    if out.shape != (len(values),):
        out = np.empty(len(values), dtype)
        for i, v in enumerate(values):
            out[i] = v
    return out


class SameStepVectorEnv(SyncVectorEnv):
    """``num_envs`` Gymnasium envs stepped in this process with SAME_STEP autoreset (see the module docstring)."""

    _observations: Any  # SyncVectorEnv's batch buffer: reset() fills it; step() only for spaces without a stacker

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]) -> None:
        super().__init__(env_fns, copy=True, autoreset_mode=AutoresetMode.SAME_STEP)
        self._stack = _stacker(self.single_observation_space, self.num_envs)
        self._index_actions = iterate.dispatch(type(self.action_space)) is _ITERATE_ARRAY

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """``SyncVectorEnv.step`` with SAME_STEP autoreset: an env whose episode ends is reset in the same step,
        its last observation and info in ``infos["final_obs"]`` / ``infos["final_info"]``."""
        if self._index_actions and isinstance(actions, np.ndarray):
            per_env: Any = actions  # actions[i] is the row iterating gives, without the IndexError that ends it
        else:
            per_env = list(iterate(self.action_space, actions))
        if len(per_env) != self.num_envs:
            raise ValueError(f"{len(per_env)} actions for {self.num_envs} envs: give one action per env")
        envs, env_obs = self.envs, self._env_obs
        rewards: list[Any] = []
        terminations: list[Any] = []
        truncations: list[Any] = []
        ended: list[int] = []
        added: list[tuple[int, dict[str, Any]]] = []  # SyncVectorEnv's _add_info calls, in order, less empty infos
        has_info = False
        for i, env in enumerate(envs):
            obs, reward, terminated, truncated, info = env.step(per_env[i])
            rewards.append(reward)
            terminations.append(terminated)
            truncations.append(truncated)
            if terminated or truncated:
                ended.append(i)
                added.append((i, {"final_obs": obs, "final_info": info}))
                has_info = has_info or bool(info)
                obs, info = env.reset()
            if info:
                has_info = True
                added.append((i, info))
            env_obs[i] = obs
        infos: dict[str, Any] = {}
        if has_info:  # Gymnasium's own merging (an empty info adds nothing there)
            for i, info in added:
                infos = self._add_info(infos, info, i)
        elif ended:  # what _add_info builds when every info is empty
            final_obs: np.ndarray = np.full(self.num_envs, fill_value=None, dtype=object)
            for i, entry in added:
                final_obs[i] = entry["final_obs"]
            mask: np.ndarray = np.zeros(self.num_envs, np.bool_)
            mask[ended] = True
            infos = {"final_obs": final_obs, "_final_obs": mask, "final_info": {}, "_final_info": mask.copy()}
        if self._stack is not None:
            observations = self._stack(env_obs)
        else:
            self._observations = concatenate(self.single_observation_space, env_obs, self._observations)
            observations = deepcopy(self._observations)
        return (observations, _per_env(rewards, np.float64), _per_env(terminations, np.bool_),
                _per_env(truncations, np.bool_), infos)
