"""A connector written the way the seed document writes ``MyGameConnector``.

A plain class (no polar base class, no polar import), its randomness drawn only from
``config["seed"]``, ``reset()`` with no seed argument, ``step()`` returning ``(obs, reward, done, info)``,
and a game that crashes its process now and then: at each step it dies with probability
``config["crash_prob"]``, decided by a second RNG stream drawn from the same seed once per step, so
for a given seed the crash always comes at the same step whatever the actions (as a game with a
seed-dependent bug does).

The game: a corridor of 7 cells; the start cell is drawn from the seeded RNG; walking right (action 1)
into the last cell wins (+1), otherwise -0.01 per step, at most 20 steps. Observation, as the seed's
example: ``{"visual": one-hot cell (7,), "inventory": [fraction of the step budget left]}``.

With ``config["log"]`` (a directory), each copy appends one line per episode start and one before a
crash to ``<log>/<pid>.log``: ``start|crash seed worker_index vector_index restarts episode step cell``
(the indices come from polar's per-copy config when it gives them, else ``-``). Tests read these lines
to see which seeds the copies played and where they crashed.
"""

import os
import random

import numpy as np
from gymnasium import spaces

CELLS = 7
MAX_STEPS = 20


class MyGameConnector:
    action_space = spaces.Discrete(2)

    def __init__(self, config):
        self.config = config
        self.seed = config["seed"]
        self.rng = random.Random(self.seed)
        self.crash_rng = random.Random(f"{self.seed}/crash")
        self.crash_prob = float(config.get("crash_prob", 0.0))
        self.log_dir = config.get("log")
        self.episode = -1
        self.steps = 0  # steps since this copy was built
        self.cell = 0
        self.t = 0

    def reset(self):
        self.episode += 1
        self.cell = self.rng.randrange(CELLS - 1)
        self.t = 0
        self._log("start")
        return self._obs()

    def step(self, action):
        self.steps += 1
        if self.crash_rng.random() < self.crash_prob:
            self._log("crash")
            os.write(2, f"MyGameConnector: segfault in the game engine at step {self.steps}\n".encode())
            os._exit(11)
        self.t += 1
        self.cell = min(CELLS - 1, self.cell + 1) if int(action) == 1 else max(0, self.cell - 1)
        won = self.cell == CELLS - 1
        done = won or self.t >= MAX_STEPS
        info = {"success": won} if done else {}
        return self._obs(), (1.0 if won else -0.01), done, info

    def close(self):
        pass

    def _obs(self):
        visual = np.zeros(CELLS, dtype=np.float32)
        visual[self.cell] = 1.0
        return {"visual": visual, "inventory": np.array([1.0 - self.t / MAX_STEPS], dtype=np.float32)}

    def _log(self, what):
        if not self.log_dir:
            return
        where = [getattr(self.config, k, "-") for k in ("worker_index", "vector_index", "restarts")]
        line = " ".join(str(x) for x in (what, self.seed, *where, self.episode, self.steps, self.cell)) + "\n"
        fd = os.open(os.path.join(self.log_dir, f"{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class BrokenStepConnector(MyGameConnector):
    """The same game with a typo in step(): every step raises."""

    def step(self, action):
        return self._obs(), self.reward_for[action], False, {}  # no such attribute
