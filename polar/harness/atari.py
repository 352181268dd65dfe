"""``harness.preset: atari``: the standard Atari preprocessing on any ``ale_py`` id, from YAML.

Noop reset (up to 30), frame skip 4 with the last two frames max-pooled, 84x84 grey (Gymnasium's
``AtariPreprocessing``), episodic life, fire reset, reward clipping and a 4-frame stack
(``FrameStackObservation``), as in Mnih et al. 2015 and SB3's ``AtariWrapper``. The stack is handed out
channels last, ``(84, 84, 4)`` uint8, because polar's encoders read uint8 HxWxC boxes as images.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from polar.config.harness import AtariPresetConfig
from polar.errors import ConfigError


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (``terminated``); the game itself resets only at game over, so value
    targets see life loss as terminal without the agent replaying the first level after every life."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:  # only a life was lost: carry on from where it was lost with one no-op step
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        self.game_over = False
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after each reset: Breakout and friends do not start until it is pressed."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
        if len(meanings) < 3 or meanings[1] != "FIRE":
            raise ConfigError(f"harness.atari.fire_reset: this game has no FIRE action ({meanings}); set it false")

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class ClipReward(gym.RewardWrapper):
    """Rewards become their sign, so one learning rate fits every game's score scale."""

    def reward(self, reward: SupportsFloat) -> float:
        return float(np.sign(float(reward)))


class ChannelsLast(gym.ObservationWrapper):
    """``(stack, H, W)`` -> ``(H, W, stack)``: the layout polar's image encoders expect."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(0, 255, (*space.shape[1:], space.shape[0]), np.uint8)

    def observation(self, observation: Any) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(np.asarray(observation), 0, -1))


def atari_base_kwargs(env_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``gym.make`` kwargs for the raw ALE env: frame skipping is the preset's, so the env's own is 1."""
    entry = gym.spec(env_id.partition(":")[2] or env_id).entry_point
    if not str(entry).startswith("ale_py"):
        raise ConfigError(f"harness.preset: atari needs an ale_py env (id: ale_py:ALE/Breakout-v5), got {env_id!r}")
    if kwargs.get("frameskip", 1) != 1:
        raise ConfigError(
            f"harness.kwargs.frameskip is {kwargs['frameskip']!r}, but preset: atari skips frames itself; "
            "remove it and set harness.atari.frame_skip instead"
        )
    return {**kwargs, "frameskip": 1}


def wrap_atari(env: gym.Env, cfg: AtariPresetConfig) -> gym.Env:
    """The standard preprocessing around a raw (``frameskip=1``) ALE env."""
    if not hasattr(env.unwrapped, "ale"):
        raise ConfigError(f"harness.preset: atari needs an ale_py env (id: ale_py:ALE/Breakout-v5), got {env}")
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=cfg.noop_max, frame_skip=cfg.frame_skip, screen_size=cfg.screen_size
    )
    if cfg.episodic_life:
        env = EpisodicLife(env)
    if cfg.fire_reset:
        env = FireReset(env)
    if cfg.clip_reward:
        env = ClipReward(env)
    env = gym.wrappers.FrameStackObservation(env, cfg.frame_stack)
    return ChannelsLast(env)
