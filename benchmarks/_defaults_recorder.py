"""Episode recorders for ``benchmarks/defaults_vs_sb3.py``: the same code on polar's side and SB3's.

Each env copy appends one JSON line per finished episode to ``<record_dir>/<copy>.jsonl``:
``[steps of this copy, episode return, wall clock, total env steps]``. Every copy counts its steps in its
own 8-byte shared file (``<record_dir>/<copy>.steps``), and the total is the sum of all copies' counts when
the episode ends: exact for copies stepped in lockstep (polar's vector envs, SB3's ``DummyVecEnv``) and for
copies that are not (polar's rollout workers run fragments apart). A connector copy whose process crashed
and was restarted reopens its counter, so the steps before the crash still count. Recording inside the
env, not in either library's episode bookkeeping, is what makes the two sides' numbers comparable.

- Gymnasium envs: ``defaults_rec/<Id>`` (registered on import; ``_defaults_recorder:defaults_rec/CartPole-v1``
  works as a polar ``harness.id``), the wrapped env's ``gym.make`` kwargs plus ``record_dir``.
- Key-door: ``RecordingKeyDoor``, ``examples/keydoor``'s ``MyGameConnector`` with the recorder, for
  polar's connector process and for SB3 through ``polar.harness.connector.vector_env.ConnectorEnv``.
  ``crash_every: N`` in its config makes each copy kill its connector process with probability 1/N per step
  (a seeded stream per copy and restart): both libraries restart it and see the interrupted episodes end as
  truncated. A copy is named by ``copy_id`` in its config (SB3: one per ``ConnectorEnv``) or by where polar
  runs it (rollout worker, vector index).
- Corridor: ``RecordingCorridor``, the connector written the way the seed document writes one
  (``tests/harness/connectors/seed_shaped.py``: a plain class, ``reset()`` without a seed, a 4-tuple
  ``step()``, randomness and crashes drawn from ``config["seed"]`` with ``crash_prob`` per step): a 7-cell
  corridor, +1 at the right end, -0.01 per step, at most 20 steps.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import zlib
from pathlib import Path

import gymnasium as gym
import numpy as np

KEYDOOR_DIR = Path(__file__).resolve().parents[1] / "examples" / "keydoor"
SEED_SHAPED_DIR = Path(__file__).resolve().parents[1] / "tests" / "harness" / "connectors"
_copies = itertools.count()


def _counter(path: Path) -> np.memmap:
    """An int64 step counter in ``path``, shared by every process that maps it (created at 0, kept if there)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size < 8:
            os.ftruncate(fd, 8)
    finally:
        os.close(fd)
    return np.memmap(path, dtype=np.int64, mode="r+", shape=(1,))


class _Log:
    """One copy's episode log: counts its steps (in a shared counter) and return, writes a line when an episode ends."""

    def __init__(self, record_dir: str, name: str | None = None) -> None:
        self.dir = Path(record_dir)
        name = name or f"{os.getpid()}-{next(_copies)}"
        self.f = (self.dir / f"{name}.jsonl").open("a", buffering=1)
        self.count = _counter(self.dir / f"{name}.steps")
        self.ret = 0.0

    @property
    def steps(self) -> int:
        return int(self.count[0])

    def total(self) -> int:
        """Env steps of every copy of the trial so far."""
        return sum(int(np.fromfile(p, dtype=np.int64, count=1)[0]) for p in self.dir.glob("*.steps"))

    def step(self, reward: float, done: bool) -> None:
        self.count[0] += 1
        self.ret += float(reward)
        if done:
            self.f.write(json.dumps([self.steps, self.ret, time.time(), self.total()]) + "\n")
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

if str(SEED_SHAPED_DIR) not in sys.path:
    sys.path.insert(0, str(SEED_SHAPED_DIR))
from seed_shaped import MyGameConnector as Corridor  # noqa: E402


def _copy_name(config: dict) -> str:
    """A copy's name that survives its process's restarts: SB3's ``copy_id``, else polar's (worker, vector index)."""
    if "copy_id" in config:
        return f"c{config['copy_id']}"
    return f"w{getattr(config, 'worker_index', 0)}-v{getattr(config, 'vector_index', 0)}"


class RecordingKeyDoor(MyGameConnector):
    """The key-door connector, recording its episodes to ``config["record_dir"]``."""

    def __init__(self, config: dict) -> None:
        own = ("record_dir", "copy_id", "crash_every", "crash_seed")
        super().__init__({k: v for k, v in config.items() if k not in own})
        where = _copy_name(config)
        self.log = _Log(config["record_dir"], f"keydoor-{where}")
        self.crash_p = 1.0 / config["crash_every"] if config.get("crash_every") else 0.0
        restarts = getattr(config, "restarts", 0)
        self.crash_rng = np.random.default_rng([int(config.get("crash_seed", 0)), zlib.crc32(where.encode()), restarts])

    def reset(self, seed: int | None = None) -> dict:
        self.log.ret = 0.0
        return super().reset(seed)

    def step(self, action: int):
        if self.crash_p and self.crash_rng.random() < self.crash_p:
            os._exit(3)  # the connector process dies mid-episode, as a game client does now and then
        obs, reward, terminated, truncated, info = super().step(action)
        self.log.step(reward, terminated or truncated)
        return obs, reward, terminated, truncated, info


class RecordingCorridor(Corridor):
    """The seed-shaped corridor connector, recording its episodes to ``config["record_dir"]``."""

    def __init__(self, config: dict) -> None:
        super().__init__(config)  # reads seed, crash_prob (and its log, unset here); the other keys are ours
        self.log = _Log(config["record_dir"], f"corridor-{_copy_name(config)}")

    def reset(self):
        self.log.ret = 0.0
        return super().reset()

    def step(self, action):
        obs, reward, done, info = super().step(action)  # may end the process (crash_prob)
        self.log.step(reward, done)
        return obs, reward, done, info
