"""Run-directory control files: how ``polar scale`` talks to a running driver without a network port.

``polar scale RUN_DIR --rollout-workers N`` writes ``RUN_DIR/control/scale.json`` atomically; the
learner (in the learner actor, or in the process that embeds the trainer) polls its mtime between
fragments, applies it, and answers in ``scale.applied.json``. A request wins over the
``distribution.autoscale`` rule: it turns the rule off for the rest of the run.
Both files are small JSON documents (never pickle), validated on read.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from polar.errors import RunDirError

CONTROL_DIR = "control"
REQUEST = "scale.json"
APPLIED = "scale.applied.json"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def request_scale(run_dir: Path, rollout_workers: int) -> dict[str, Any]:
    if rollout_workers < 1:
        raise RunDirError(f"--rollout-workers must be >= 1 (got {rollout_workers})")
    req = {"rollout_workers": int(rollout_workers), "requested_at": time.time()}
    _write_json(Path(run_dir) / CONTROL_DIR / REQUEST, req)
    return req


def read_applied(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / CONTROL_DIR / APPLIED
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


class ScaleWatcher:
    """Polled by the driver; returns a new worker count when a fresh, valid request appeared."""

    def __init__(self, run_dir: Path | None, poll_interval_s: float = 1.0) -> None:
        self.path = Path(run_dir) / CONTROL_DIR / REQUEST if run_dir else None
        self.poll_interval_s = poll_interval_s
        self._last_check = 0.0
        self._last_mtime = self.path.stat().st_mtime_ns if self.path and self.path.exists() else None

    def poll(self) -> int | None:
        if self.path is None or time.monotonic() - self._last_check < self.poll_interval_s:
            return None
        self._last_check = time.monotonic()
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            return None
        if mtime == self._last_mtime:
            return None
        self._last_mtime = mtime
        try:
            n = int(json.loads(self.path.read_text())["rollout_workers"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a half-written or foreign file: ignore it, the next write wins
        return n if n >= 1 else None

    def applied(self, n: int, run_dir: Path | None = None) -> None:
        if self.path is not None:
            _write_json(self.path.parent / APPLIED, {"rollout_workers": n, "applied_at": time.time()})
