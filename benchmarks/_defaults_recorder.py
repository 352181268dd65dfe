"""Episode recorders for ``benchmarks/defaults_vs_sb3.py``: the same code on polar's side and SB3's.

Each env copy appends one JSON line per finished episode to ``<record_dir>/<pid>-<copy>.jsonl``:
``[steps of this copy, episode return, wall clock]``. Both libraries step their envs in lockstep
(polar's vector envs and SB3's ``DummyVecEnv``, SAME_STEP autoreset inside a connector), so the
run's total env steps at that moment are ``steps of this copy x number of envs``. Recording inside the
env, not in either library's episode bookkeeping, is what makes the two sides' numbers comparable.

- Gymnasium envs: ``defaults_rec/<Id>`` (registered on import; ``_defaults_recorder:defaults_rec/CartPole-v1``
  works as a polar ``harness.id``), the wrapped env's ``gym.make`` kwargs plus ``record_dir``.
- Key-door: ``RecordingKeyDoor``, ``examples/keydoor``'s ``MyGameConnector`` with the recorder, for
  polar's connector process and for SB3 through ``polar.harness.connector.vector_env.ConnectorEnv``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

import gymnasium as gym

KEYDOOR_DIR = Path(__file__).resolve().parents[1] / "examples" / "keydoor"
_copies = itertools.count()


class _Log:
    """One copy's episode log: counts its steps and return, writes a line when an episode ends."""

    def __init__(self, record_dir: str) -> None:
        self.path = Path(record_dir) / f"{os.getpid()}-{next(_copies)}.jsonl"
        self.f = self.path.open("a", buffering=1)
        self.steps = 0
        self.ret = 0.0

    def step(self, reward: float, done: bool) -> None:
        self.steps += 1
        self.ret += float(reward)
        if done:
            self.f.write(json.dumps([self.steps, self.ret, time.time()]) + "\n")
            self.ret = 0.0


class Recorder(gym.Wrapper):
    """Writes every finished episode of the wrapped env (see the module docstring)."""

    def __init__(self, env: gym.Env, record_dir: str) -> None:
        super().__init__(env)
        self.log = _Log(record_dir)

    def reset(self, **kwargs):
        self.log.ret = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.log.step(reward, terminated or truncated)
        return obs, reward, terminated, truncated, info


def _make(wrapped_id: str, record_dir: str, **kwargs) -> gym.Env:
    return Recorder(gym.make(wrapped_id, **kwargs), record_dir)


for _id in ("CartPole-v1", "Acrobot-v1", "FrozenLake-v1"):
    if f"defaults_rec/{_id}" not in gym.registry:
        gym.register(f"defaults_rec/{_id}", entry_point=_make, kwargs={"wrapped_id": _id}, disable_env_checker=True)

if str(KEYDOOR_DIR) not in sys.path:
    sys.path.insert(0, str(KEYDOOR_DIR))
from my_game_connector import MyGameConnector  # noqa: E402


class RecordingKeyDoor(MyGameConnector):
    """The key-door connector, recording its episodes to ``config["record_dir"]``."""

    def __init__(self, config: dict) -> None:
        super().__init__({k: v for k, v in config.items() if k != "record_dir"})
        self.log = _Log(config["record_dir"])

    def reset(self, seed: int | None = None) -> dict:
        self.log.ret = 0.0
        return super().reset(seed)

    def step(self, action: int):
        obs, reward, terminated, truncated, info = super().step(action)
        self.log.step(reward, terminated or truncated)
        return obs, reward, terminated, truncated, info
