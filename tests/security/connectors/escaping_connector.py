"""Python connectors for the containment tests: one whose descendants try to outlive the run, one that
reports the interpreter it runs under."""

from __future__ import annotations

import os
import sys

import numpy as np
from gymnasium import spaces

# Run by the connector's child: it forks a grandchild that setsid()s into its own session and a daemon
# that double-forks away, and each of the three writes "<role> <pid>" to the pid file, then sleeps.
ESCAPE = r"""
import os, sys, time
pid_file = sys.argv[1]
def note(role):
    with open(pid_file, "a") as f:
        f.write(f"{role} {os.getpid()}\n")
if os.fork() == 0:  # the grandchild: a session of its own (out of the connector's process group)
    os.setsid()
    note("setsid_grandchild")
    time.sleep(600)
    os._exit(0)
if os.fork() == 0:  # a classic daemon: fork, setsid, fork again, the middle process exits
    os.setsid()
    if os.fork() == 0:
        note("double_forked_daemon")
        time.sleep(600)
    os._exit(0)
note("child")
time.sleep(600)
"""
_spawned = False


class EscapingConnector:
    """A plain game whose process leaves descendants that try to survive polar."""

    action_space = spaces.Discrete(2)
    observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def __init__(self, config: dict) -> None:
        global _spawned
        if not _spawned:
            _spawned = True
            import subprocess

            with open(config["pid_file"], "a") as f:
                f.write(f"connector {os.getpid()}\n")
            subprocess.Popen([sys.executable, "-c", ESCAPE, config["pid_file"]], stdin=subprocess.DEVNULL)
        self.t = 0

    def reset(self, seed: int | None = None) -> np.ndarray:
        self.t = 0
        return np.zeros(2, dtype=np.float32)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, dict]:
        self.t += 1
        return np.zeros(2, dtype=np.float32), 1.0, self.t >= 20, {}

    def close(self) -> None:
        pass


class InterpreterConnector:
    """Writes the interpreter it runs under (``sys.executable``) to ``config["report"]``."""

    action_space = spaces.Discrete(2)
    observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def __init__(self, config: dict) -> None:
        with open(config["report"], "w") as f:
            f.write(sys.executable)

    def reset(self, seed: int | None = None) -> np.ndarray:
        return np.zeros(2, dtype=np.float32)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, dict]:
        return np.zeros(2, dtype=np.float32), 0.0, True, {}
