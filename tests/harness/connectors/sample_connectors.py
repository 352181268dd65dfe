"""Small connector classes for the harness tests. Each misbehaves in one documented way when asked."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from gymnasium import spaces


class CountingConnector:
    """Episodes of exactly ``length`` steps, reward 1 per step; obs = [t, episode index].

    config: length, log (append a line per completed episode), hang_once_at (step count at which the
    first process hangs; a flag file makes it once), raise_at, exit_at, print (to stdout each step).
    """

    observation_space = spaces.Box(0, 1e6, shape=(2,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, config: dict) -> None:
        self.cfg = config
        self.length = int(config.get("length", 5))
        self.t = 0
        self.episode = 0
        self.total = 0
        self.copy = id(self)

    def reset(self, seed: int | None = None):
        self.t = 0
        return np.array([self.t, self.episode], dtype=np.float32)

    def step(self, action):
        self.t += 1
        self.total += 1
        cfg = self.cfg
        if cfg.get("print"):
            print(f"stdout chatter step {self.total}", flush=True)
        if cfg.get("raise_at") == self.total:
            raise ValueError(f"bad move at step {self.total}")
        if cfg.get("exit_at") is not None and self.total >= cfg["exit_at"]:
            sys.stderr.write("fatal: reactor core breach\n")
            sys.stderr.flush()
            os._exit(3)
        flag = cfg.get("hang_flag")
        if flag and cfg.get("hang_once_at") == self.total and not os.path.exists(flag):
            open(flag, "w").close()
            time.sleep(3600)
        done = self.t >= self.length
        info = {}
        if done:
            info = {"episode_id": f"{os.getpid()}-{self.copy}-{self.episode}"}
            if cfg.get("log"):
                with open(cfg["log"], "a") as f:
                    f.write(info["episode_id"] + "\n")
            self.episode += 1
        return np.array([self.t, self.episode], dtype=np.float32), 1.0, done, info


class InferredConnector:
    """Declares no observation_space: polar infers Dict(Box, Box) from the first observation."""

    action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def __init__(self, config: dict) -> None:
        self.t = 0

    def reset(self):
        self.t = 0
        return {"image": np.zeros((4, 4, 3), dtype=np.uint8), "vec": np.zeros(3, dtype=np.float32)}

    def step(self, action):
        self.t += 1
        obs = {"image": np.full((4, 4, 3), self.t, dtype=np.uint8), "vec": np.asarray(action, dtype=np.float32).sum() * np.ones(3, dtype=np.float32)}
        return obs, float(np.sum(action)), self.t >= 3, {}


class BigObsConnector:
    """A 256 KiB observation (zeros: compresses to almost nothing)."""

    observation_space = spaces.Box(0, 255, shape=(256, 256, 4), dtype=np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, config: dict) -> None:
        pass

    def reset(self):
        return np.zeros((256, 256, 4), dtype=np.uint8)

    def step(self, action):
        return self.reset(), 0.0, False, {}


class NoStepConnector:
    action_space = spaces.Discrete(2)

    def __init__(self, config: dict) -> None:
        pass

    def reset(self):
        return np.zeros(2, dtype=np.float32)


class OutOfSpaceConnector:
    """Declares Box(0, 1) but steps to 5.0: the checker must say so."""

    observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, config: dict) -> None:
        self.t = 0

    def reset(self, seed=None):
        self.t = 0
        return np.zeros(1, dtype=np.float32)

    def step(self, action):
        self.t += 1
        return np.full(1, 5.0, dtype=np.float32), 0.0, self.t >= 10, {}


class UnseededConnector:
    """Ignores its seed: the same seed gives different episodes. The checker must say so."""

    observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, config: dict) -> None:
        self.t = 0

    def reset(self, seed=None):
        self.t = 0
        return np.random.default_rng().random(1).astype(np.float32)

    def step(self, action):
        self.t += 1
        return np.random.default_rng().random(1).astype(np.float32), 0.0, self.t >= 10, {}


class ThreeTupleConnector:
    observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, config: dict) -> None:
        pass

    def reset(self, seed=None):
        return np.zeros(1, dtype=np.float32)

    def step(self, action):
        return np.zeros(1, dtype=np.float32), 0.0, False
