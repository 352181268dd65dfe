"""EnvPool ids from YAML (``harness: {type: envpool, id: CartPole-v1}``) as polar's SAME_STEP vector env.

EnvPool steps its envs in C++ threads and autoresets NEXT_STEP: the step that ends an episode returns the
final observation, and the *next* step ignores that env's action and returns its reset observation with
reward 0. polar's contract (``polar.harness``) is Gymnasium's SAME_STEP: the ending step already returns
the next episode's first observation and puts the final one in ``infos["final_obs"]``, which the runner
uses to bootstrap truncated episodes. ``EnvPoolVectorEnv`` converts: when envs end, it resets exactly
those envs at once (``reset(env_ids)``, one more C++ call), so every ``step`` is a real step for every env
and no action is dropped.

The time limit is applied here, not by EnvPool: an EnvPool episode that ends naturally on its last allowed
step reports ``truncated`` alone (``terminated = done & ~trunc``), and the runner would bootstrap a value
from a terminal state. So the pool gets no limit of its own, and ``max_episode_steps`` (the id's default,
or the one in ``harness.kwargs``) is counted here as Gymnasium's ``TimeLimit`` does: an episode that
terminates on its last step is ``terminated`` and ``truncated``, and is not bootstrapped.

Seeds are fixed when an EnvPool is made, so ``reset(seed=s)`` makes the pool again with seed ``s``
(env ``i`` gets EnvPool's seed ``s + i``); a ``reset()`` without a seed continues the envs' own generators.
"""

from __future__ import annotations

import difflib
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from polar.errors import ConfigError

LIST_IDS = "python -c 'import envpool; print(envpool.list_all_envs())'"
"""The command an unknown-id error points to."""

RESERVED_KWARGS = {
    "num_envs": "distribution.num_envs (envs per rollout worker: distribution.envs_per_runner)",
    "batch_size": "nothing: polar steps every env each step (EnvPool's synchronous mode)",
    "seed": "the run's seed (top-level seed:)",
    "env_seed": "the run's seed (top-level seed:)",
    "gym_reset_return_info": "nothing: resets always return an info dict",
}


def _envpool() -> Any:  # the module; imported late so polar imports without it
    try:
        import envpool
    except ImportError as e:
        raise ConfigError(f"harness.type envpool needs the envpool package ({e}); pip install envpool") from None
    return envpool


def check_id(env_id: str, kwargs: dict[str, Any] | None = None) -> None:
    """``env_id`` is an EnvPool id and ``kwargs`` are options of it, or one ``ConfigError``.

    ``polar run`` calls it before it creates anything, and every env factory here again."""
    envpool = _envpool()
    ids = envpool.list_all_envs()
    if env_id not in ids:
        close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
        hint = f" (did you mean: {', '.join(close)}?)" if close else ""
        raise ConfigError(f"harness.id: unknown EnvPool id {env_id!r}{hint}; list the valid ids with: {LIST_IDS}")
    for key in kwargs or {}:
        if key in RESERVED_KWARGS:
            raise ConfigError(f"harness.kwargs.{key}: polar sets it; use {RESERVED_KWARGS[key]}")
    options = [k for k in envpool.make_spec(env_id)._config_keys if k not in RESERVED_KWARGS and k != "base_path"]
    unknown = [k for k in kwargs or {} if k not in options]
    if unknown:
        raise ConfigError(f"harness.kwargs.{unknown[0]}: EnvPool's {env_id} has no such option; its options are "
                          f"{', '.join(options)}")


NO_LIMIT = 2**30
"""The pool's own ``max_episode_steps``: never reached; the limit is counted in Python."""


def _make_pool(env_id: str, num_envs: int, seed: int, kwargs: dict[str, Any]) -> Any:
    return _envpool().make_gymnasium(env_id, num_envs=num_envs, batch_size=num_envs, seed=seed, **kwargs)


def _time_limit(env_id: str, kwargs: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
    """``(max_episode_steps, pool kwargs)``: the id's limit (``kwargs`` override it), and kwargs that lift the
    pool's own; ``(None, kwargs)`` for ids without one."""
    if "max_episode_steps" not in _envpool().make_spec(env_id)._config_keys:
        return None, dict(kwargs)
    limit = kwargs.get("max_episode_steps", _envpool().make_spec(env_id).config.max_episode_steps)
    return int(limit), {**kwargs, "max_episode_steps": NO_LIMIT}


def _fresh_seed() -> int:
    """A random int32 seed: Gymnasium's ``reset()`` without a seed is not reproducible, and neither is this."""
    return int(np.random.SeedSequence().generate_state(1)[0] % (2**31 - 1))


class EnvPoolVectorEnv(gym.vector.VectorEnv):  # type: ignore[misc]  # gymnasium's VectorEnv is untyped
    """``num_envs`` copies of an EnvPool id in one synchronous pool, with SAME_STEP autoreset."""

    metadata: dict[str, Any] = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, env_id: str, num_envs: int, kwargs: dict[str, Any] | None = None,
                 seed: int | None = None) -> None:
        check_id(env_id, kwargs)
        self.env_id = env_id
        self.num_envs = num_envs
        self.kwargs = dict(kwargs or {})
        self.max_episode_steps, self._pool_kwargs = _time_limit(env_id, self.kwargs)
        self._elapsed: np.ndarray = np.zeros(num_envs, np.int64)
        self._seed = _fresh_seed() if seed is None else int(seed)
        self._pool = _make_pool(env_id, num_envs, self._seed, self._pool_kwargs)
        self._fresh = True  # no reset or step yet: reset(seed=self._seed) need not make it again
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if options:
            raise ValueError(f"EnvPoolVectorEnv.reset takes no options (got {sorted(options)})")
        if seed is not None and (seed != self._seed or not self._fresh):
            self._pool.close()
            self._seed = int(seed)
            self._pool = _make_pool(self.env_id, self.num_envs, self._seed, self._pool_kwargs)
        self._fresh = False
        self._elapsed[:] = 0
        obs, _ = self._pool.reset()
        return obs, {}

    def step_pool(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """One step of every env with the time limit applied, no reset: ``(obs, reward, terminated, truncated)``."""
        self._fresh = False
        obs, reward, terminated, truncated, _ = self._pool.step(actions)
        if self.max_episode_steps is not None:
            self._elapsed += 1
            truncated = truncated | (self._elapsed >= self.max_episode_steps)
        return obs, reward, terminated, truncated

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, reward, terminated, truncated = self.step_pool(actions)
        done = terminated | truncated
        infos: dict[str, Any] = {}
        if done.any():
            ids = np.flatnonzero(done)
            final_obs: np.ndarray = np.full(self.num_envs, None, dtype=object)
            reset_obs, _ = self._pool.reset(ids.astype(np.int32))
            if isinstance(obs, dict):  # a Dict observation space: one array per key
                for i in ids:
                    final_obs[i] = {k: v[i].copy() for k, v in obs.items()}
                for k, v in obs.items():
                    v[ids] = reset_obs[k]
            else:
                for i in ids:
                    final_obs[i] = obs[i].copy()
                obs[ids] = reset_obs
            self._elapsed[ids] = 0
            infos = {"final_obs": final_obs, "_final_obs": done.copy(), "final_info": {}, "_final_info": done.copy()}
        return obs, reward, terminated, truncated, infos

    def close(self, **kwargs: Any) -> None:
        self._pool.close()


class EnvPoolEnv(gym.Env):  # type: ignore[misc]  # gymnasium's Env is untyped
    """One copy of an EnvPool id as a Gymnasium env (evaluation, ``polar check``, recording)."""

    def __init__(self, env_id: str, kwargs: dict[str, Any] | None = None, seed: int | None = None) -> None:
        self._envs = EnvPoolVectorEnv(env_id, 1, kwargs, seed)
        self.observation_space = self._envs.single_observation_space
        self.action_space = self._envs.single_action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        obs, info = self._envs.reset(seed=seed, options=options)
        return obs[0], info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        # no autoreset: a single env's caller sees the final observation and calls reset() itself
        obs, reward, terminated, truncated = self._envs.step_pool(np.asarray(action)[None])
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), {}

    def close(self) -> None:
        self._envs.close()


def make_envpool_vector_env(env_id: str, num_envs: int, kwargs: dict[str, Any], seed: int | None) -> EnvPoolVectorEnv:
    with warnings.catch_warnings():  # EnvPool's Box spaces are float64 bounds cast to float32: Gymnasium warns
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        return EnvPoolVectorEnv(env_id, num_envs, kwargs, seed)


def make_envpool_env(env_id: str, kwargs: dict[str, Any]) -> EnvPoolEnv:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")
        return EnvPoolEnv(env_id, kwargs)
