"""Robustness wrappers (Gymnasium wrappers) for evaluation: observation noise, action delay and repeat,
sticky actions, distractor features, and a held-out seed range.

Every wrapper with randomness draws it from its own generator, reseeded from the seed passed to
``reset(seed=...)``: the same episode seed gives the same noise, so evaluations repeat exactly.
"""

from __future__ import annotations

from collections import deque
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from polar.errors import ConfigError


def _rng(seed: int | None, salt: int) -> np.random.Generator | None:
    return None if seed is None else np.random.default_rng([int(seed) % 2**63, salt])


class _Seeded(gym.Wrapper[Any, Any, Any, Any]):
    SALT = 0

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        self.rng = np.random.default_rng(self.SALT)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        rng = _rng(seed, self.SALT)
        if rng is not None:
            self.rng = rng
        return self.env.reset(seed=seed, options=options)


class ObservationNoise(_Seeded):
    """Adds N(0, std) to every Box observation (or the Box entries ``keys`` of a Dict observation), clipped
    to the space's bounds; other entries pass unchanged."""

    SALT = 11

    def __init__(self, env: gym.Env[Any, Any], std: float, keys: list[str] | None = None) -> None:
        super().__init__(env)
        if std <= 0:
            raise ConfigError(f"observation_noise.std must be > 0 (got {std})")
        space = env.observation_space
        if isinstance(space, gym.spaces.Dict):
            names = keys or [k for k, s in space.spaces.items() if isinstance(s, gym.spaces.Box)]
            for k in names:
                if k not in space.spaces or not isinstance(space.spaces[k], gym.spaces.Box):
                    raise ConfigError(f"observation_noise.keys: {k!r} is not a Box entry of the observation "
                                      f"(entries: {', '.join(space.spaces)})")
            self.keys: list[str] | None = names
        elif isinstance(space, gym.spaces.Box):
            if keys:
                raise ConfigError("observation_noise.keys applies to Dict observations; this one is a Box")
            self.keys = None
        else:
            raise ConfigError(f"observation_noise needs Box observations (or a Dict of them); got {space}")
        self.std = float(std)

    def _noisy(self, x: np.ndarray, space: gym.spaces.Box) -> np.ndarray:
        y = x + self.rng.normal(0.0, self.std, size=np.shape(x))
        return np.clip(y, space.low, space.high).astype(space.dtype, copy=False)

    def observation(self, obs: Any) -> Any:
        space = self.env.observation_space
        if self.keys is None:
            return self._noisy(obs, space)
        return {k: (self._noisy(v, space.spaces[k]) if k in self.keys else v) for k, v in obs.items()}

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = super().reset(**kwargs)
        return self.observation(obs), info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, r, term, trunc, info = self.env.step(action)
        return self.observation(obs), r, term, trunc, info


def _noop(space: gym.Space) -> Any:
    if isinstance(space, gym.spaces.Box):
        return np.zeros(space.shape, space.dtype)
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.zeros(space.shape, space.dtype)
    raise ConfigError(f"action_delay needs a Box, Discrete or MultiDiscrete action space; got {space}")


class ActionDelay(gym.Wrapper[Any, Any, Any, Any]):
    """The env executes the action chosen ``steps`` steps earlier; the first ``steps`` steps of an episode
    execute a no-op (zeros, or the first discrete action)."""

    def __init__(self, env: gym.Env[Any, Any], steps: int) -> None:
        super().__init__(env)
        if steps < 1:
            raise ConfigError(f"action_delay.steps must be >= 1 (got {steps})")
        self.steps = int(steps)
        self.noop = _noop(env.action_space)
        self.queue: deque[Any] = deque()

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.queue = deque([self.noop] * self.steps)
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        self.queue.append(action)
        return self.env.step(self.queue.popleft())


class ActionRepeat(gym.Wrapper[Any, Any, Any, Any]):
    """Executes each action ``times`` times (stopping early when the episode ends), summing the rewards."""

    def __init__(self, env: gym.Env[Any, Any], times: int) -> None:
        super().__init__(env)
        if times < 2:
            raise ConfigError(f"action_repeat.times must be >= 2 (got {times})")
        self.times = int(times)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        total = 0.0
        for _ in range(self.times):
            obs, r, term, trunc, info = self.env.step(action)
            total += float(r)
            if term or trunc:
                break
        return obs, total, term, trunc, info


class StickyActions(_Seeded):
    """With probability ``prob`` per step the previous action is executed instead of the chosen one."""

    SALT = 13

    def __init__(self, env: gym.Env[Any, Any], prob: float) -> None:
        super().__init__(env)
        if not 0 < prob < 1:
            raise ConfigError(f"sticky_actions.prob must be in (0, 1) (got {prob})")
        self.prob = float(prob)
        self.prev: Any = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.prev = None
        return super().reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.prev is not None and self.rng.random() < self.prob:
            action = self.prev
        self.prev = action
        return self.env.step(action)


class DistractorFeatures(_Seeded):
    """Appends ``count`` N(0, std) features, fresh every step, to a flat Box observation. The policy must
    have been built for the wider observation."""

    SALT = 17

    def __init__(self, env: gym.Env[Any, Any], count: int, std: float = 1.0) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ConfigError(f"distractor_features needs a flat (1-D) Box observation; got {space}")
        if count < 1:
            raise ConfigError(f"distractor_features.count must be >= 1 (got {count})")
        self.count, self.std = int(count), float(std)
        low = np.concatenate([space.low, np.full(count, -np.inf)]).astype(space.dtype)
        high = np.concatenate([space.high, np.full(count, np.inf)]).astype(space.dtype)
        self.observation_space = gym.spaces.Box(low, high, dtype=space.dtype)

    def _extend(self, obs: np.ndarray) -> np.ndarray:
        extra = self.rng.normal(0.0, self.std, size=self.count)
        return np.concatenate([np.asarray(obs), extra]).astype(self.observation_space.dtype, copy=False)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = super().reset(**kwargs)
        return self._extend(obs), info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, r, term, trunc, info = self.env.step(action)
        return self._extend(obs), r, term, trunc, info


class HeldOutSeeds(gym.Wrapper[Any, Any, Any, Any]):
    """Episodes only from the seed range ``[start, start + count)``: ``reset()`` takes the next seed of the
    range, ``reset(seed=s)`` checks that ``s`` is in it. Keeps evaluation episodes apart from training ones."""

    def __init__(self, env: gym.Env[Any, Any], start: int, count: int) -> None:
        super().__init__(env)
        if count < 1:
            raise ConfigError(f"held-out seeds: count must be >= 1 (got {count})")
        self.start, self.count = int(start), int(count)
        self.next_seed = self.start

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if seed is None:
            if self.next_seed >= self.start + self.count:
                raise ConfigError(f"held-out seed range [{self.start}, {self.start + self.count}) is used up after "
                                  f"{self.count} episodes; raise seeds.count")
            seed = self.next_seed
        elif not self.start <= seed < self.start + self.count:
            raise ConfigError(f"seed {seed} is outside the held-out range [{self.start}, {self.start + self.count})")
        self.next_seed = seed + 1
        return self.env.reset(seed=seed, options=options)


WRAPPERS = {
    "observation_noise": lambda env, s: ObservationNoise(env, s.std, s.keys),
    "action_delay": lambda env, s: ActionDelay(env, s.steps),
    "action_repeat": lambda env, s: ActionRepeat(env, s.times),
    "sticky_actions": lambda env, s: StickyActions(env, s.prob),
    "distractor_features": lambda env, s: DistractorFeatures(env, s.count, s.std),
}


def apply_wrappers(env: gym.Env[Any, Any], specs: list[Any]) -> gym.Env[Any, Any]:
    """Wrap ``env`` in the suite's wrapper specs, first spec innermost."""
    for spec in specs:
        env = WRAPPERS[spec.type](env, spec)
    return env
