"""A candidate reward function, run in bubblewrap, and the Gymnasium env whose reward it computes.

The candidate's code never enters a polar process: :class:`SandboxedReward` starts
``reward_host.py`` under bubblewrap (read-only system and interpreter, no network, a fresh ``/tmp``,
only the candidate's own folder writable, ``nobody`` when polar runs as root, CPU/memory/process limits)
and asks it for one reward per step over a pipe, each answer within ``call_timeout_s``. The task's own
reward is kept aside (``info["task_reward"]``) and each episode's task return is appended to
``returns_path`` by this trusted wrapper, so the designer scores candidates by the task, not by
anything the candidate says.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from polar.errors import HarnessError
from polar.harness.agent.isolation import interpreter_paths
from polar.harness.agent.sandbox import NOBODY, bwrap_args, bwrap_unusable, setpriv_args

HOST = Path(__file__).resolve().parent / "reward_host.py"
ENV_ID = "polar-llmroles/ShapedReward-v0"


class CandidateFailed(HarnessError):
    """The candidate raised, hung, returned a non-number or ended its process."""


def _plain(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


class SandboxedReward:
    """One sandboxed ``compute_reward`` process for the candidate file in ``folder``."""

    def __init__(self, folder: Path, *, call_timeout_s: float = 5.0, start_timeout_s: float = 30.0,
                 cpu_time_s: int = 600, memory_mb: int = 1024, max_processes: int = 16) -> None:
        why = bwrap_unusable()
        if why:
            raise HarnessError(f"reward candidate: bubblewrap cannot run here ({why}); candidate code is only "
                               "run sandboxed, so install bubblewrap (apt-get install bubblewrap)")
        self.folder = folder.resolve()
        self.call_timeout_s, self.start_timeout_s = call_timeout_s, start_timeout_s
        uid = NOBODY if os.geteuid() == 0 else None
        if uid is not None:
            os.chown(self.folder, uid, uid)
            for p in self.folder.iterdir():
                os.lchown(p, uid, uid)
        inner = [sys.executable, "-I", "-B", str(HOST), str(self.folder / "candidate.py")]
        if shutil.which("prlimit"):
            inner = ["prlimit", f"--cpu={cpu_time_s}", f"--as={memory_mb << 20}",
                     f"--nproc={max_processes}:{max_processes}", "--", *inner]
        if uid is not None:
            inner = [*setpriv_args(uid), *inner]
        argv = bwrap_args(rw=[str(self.folder)], ro=[str(HOST), *interpreter_paths()], unshare_net=True,
                          chdir=str(self.folder)) + inner
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        self.stderr_path = self.folder.parent / f"{self.folder.name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env=env, start_new_session=True)
        self._sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._first = True

    def _stderr_tail(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        try:
            return self.stderr_path.read_bytes()[-400:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def __call__(self, obs: Any, action: Any, next_obs: Any, terminated: bool, truncated: bool) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        query = {"obs": _plain(obs), "action": _plain(action), "next_obs": _plain(next_obs),
                 "terminated": bool(terminated), "truncated": bool(truncated)}
        try:
            self.proc.stdin.write((json.dumps(query) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self.close()
            raise CandidateFailed(f"the candidate's process ended before answering: {self._stderr_tail()}") from None

        limit_s = self.start_timeout_s + self.call_timeout_s if self._first else self.call_timeout_s
        self._first = False
        deadline = time.monotonic() + limit_s
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                self.close()
                raise CandidateFailed(f"compute_reward did not answer within {limit_s:.1f}s (hang or too slow)")
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                self.close()
                raise CandidateFailed(f"the candidate's process ended without an answer: {self._stderr_tail()}")

            line += chunk
            if len(line) > 65536:
                self.close()
                raise CandidateFailed("the candidate's process wrote more than 64 KiB for one answer")
        try:
            reply = json.loads(line.split(b"\n", 1)[0])
        except ValueError:
            self.close()
            raise CandidateFailed("the candidate's process broke the reward protocol") from None
        if "error" in reply:
            self.close()
            raise CandidateFailed(str(reply["error"])[:500])
        r = reply.get("reward")
        if not isinstance(r, (int, float)) or not np.isfinite(r):
            self.close()
            raise CandidateFailed(f"compute_reward returned {r!r}, not a finite number")
        return float(r)

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except OSError:
                self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(KeyError, ValueError):
            self._sel.close()
        self._stderr.close()


class ShapedRewardEnv(gym.Wrapper[Any, Any, Any, Any]):
    """``base_id`` with its reward replaced by the sandboxed candidate in ``candidate_dir``.

    The task's reward goes to ``info["task_reward"]``; each finished episode's task return is appended
    (one JSON line) to ``returns_path``. A failing candidate writes its reason to ``failure_path`` and
    ends the run with :class:`CandidateFailed`."""

    def __init__(self, base_id: str, candidate_dir: str, returns_path: str, failure_path: str,
                 call_timeout_s: float = 5.0, base_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(gym.make(base_id, **(base_kwargs or {})))
        self.returns_path, self.failure_path = Path(returns_path), Path(failure_path)
        self.reward_fn = SandboxedReward(Path(candidate_dir), call_timeout_s=call_timeout_s)
        self._obs: Any = None
        self._task_return = 0.0
        self._length = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._obs, self._task_return, self._length = obs, 0.0, 0
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, task_reward, terminated, truncated, info = self.env.step(action)
        try:
            reward = self.reward_fn(self._obs, action, obs, terminated, truncated)
        except CandidateFailed as e:
            self.failure_path.write_text(str(e))
            raise
        self._obs = obs
        self._task_return += float(task_reward)
        self._length += 1
        if terminated or truncated:
            with open(self.returns_path, "a") as f:
                f.write(json.dumps({"task_return": self._task_return, "length": self._length}) + "\n")
        return obs, reward, terminated, truncated, {**info, "task_reward": float(task_reward)}

    def close(self) -> None:
        self.reward_fn.close()
        super().close()


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=ShapedRewardEnv)
