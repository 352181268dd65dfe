"""The run directory every kind of run writes (PPO, GRPO, ...), so eval, resume and dashboards read them alike::

    runs/<name>-<YYYYmmdd-HHMMSS>/
      run.json              who made it: kind, name, config_dir, polar version; status (see below) and the
                            process that owns the run (pid, host, start time)
      config.resolved.yaml  the validated config with every default filled in
      metrics.jsonl         one JSON object per logged iteration
      tb/                   TensorBoard event files
      checkpoints/          ckpt_<iteration>.pt + LATEST
      eval/                 evaluation results as JSON
      control/              ray: `polar scale` requests (scale.json) and their answers (scale.applied.json)
      scale_events.jsonl    ray: every rollout-worker resize, by the autoscale rule or a request, with its reason

``status`` is ``created``, ``starting`` (setting up) or ``running`` while a process works on the run, then one of ``finished``, ``failed``
(with ``error``) or ``interrupted`` (Ctrl-C / SIGTERM, with ``checkpoint``: the final one, or null); see
``polar.trainers.lifecycle``. A run recorded as live whose process is gone (SIGKILL, power loss, OOM) is
reported ``killed`` by ``RunDir.status()`` / ``run_status()``, the one place resume, eval and dashboards ask.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from polar.errors import RunDirError, os_cause

log = logging.getLogger(__name__)

META = "run.json"
LIVE_STATUSES = ("created", "starting", "running")  # recorded while a process works on the run
FINAL_STATUSES = ("finished", "failed", "interrupted", "killed")


def process_identity() -> dict[str, Any]:
    """This process as ``run.json`` records its owner: the start time tells a reused pid from the owner."""
    import socket

    import psutil

    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "start_time": psutil.Process(pid).create_time()}


def owner_alive(owner: dict[str, Any] | None) -> bool | None:
    """Whether the process ``owner`` (from ``process_identity``) still runs; None when this host cannot tell
    (no owner recorded, or it ran on another host)."""
    import socket

    import psutil

    if not isinstance(owner, dict) or "pid" not in owner:
        return None
    if owner.get("host") != socket.gethostname():
        return None
    try:
        proc = psutil.Process(int(owner["pid"]))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        start = owner.get("start_time")
        return start is None or abs(proc.create_time() - float(start)) < 1.0  # else the pid was reused
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, TypeError):
        return False


def run_status(path: str | Path) -> dict[str, Any]:
    """A run's status as a dashboard shows it: ``status`` (``killed`` for a live-recorded run whose process is
    gone), the ``recorded`` status, the owner ``pid``/``host``, ``error`` and final ``checkpoint``."""
    meta = RunDir.open(path).read_meta()
    recorded = meta.get("status")
    owner = meta.get("process") or {}
    status = recorded
    if recorded in LIVE_STATUSES and owner_alive(owner) is False:
        status = "killed"
    return {"status": status, "recorded": recorded, "pid": owner.get("pid"), "host": owner.get("host"),
            "error": meta.get("error"), "checkpoint": meta.get("checkpoint")}


def status_line(path: str | Path) -> str:
    """One line for people: ``run status: killed (recorded running, but its process pid 12 on host is gone)``."""
    st = run_status(path)
    status = st["status"]
    if status == "killed":
        return (f"run status: killed (recorded {st['recorded']}, but its process pid {st['pid']} on {st['host']} is "
                "gone: SIGKILL, out of memory or power loss)")
    if status in ("failed", "interrupted") and st["error"]:
        return f"run status: {status} ({st['error']})"
    if status in LIVE_STATUSES and st["pid"] is not None:
        return f"run status: {status} (pid {st['pid']} on {st['host']})"
    return f"run status: {status}"


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory + fsync + os.replace: readers see old or new, never half.

    A failed write (disk full, read-only directory) removes the temp file and raises one ``RunDirError``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise RunDirError(f"cannot write {path}: {os_cause(e)}") from None


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # ------------------------------------------------------------------ create / open
    @classmethod
    def create(cls, name: str, run_dir: str | Path | None = None, base: str | Path = "runs", kind: str = "ppo",
               config_dir: str | Path | None = None) -> RunDir:
        """A fresh run directory. Refuses a directory that already holds files (use ``polar resume`` for those)."""
        if run_dir is not None:
            path = Path(run_dir)
            if path.exists() and (not path.is_dir() or any(path.iterdir())):
                what = "another run" if (path / META).exists() else "files"
                raise RunDirError(
                    f"--run-dir {path} already holds {what}; continue it with `polar resume {path}` or choose an "
                    "empty/new directory."
                )
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = Path(base) / f"{name}-{stamp}"
            n = 1
            while path.exists():
                n += 1
                path = Path(base) / f"{name}-{stamp}-{n}"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"cannot create run directory {path}: {e}") from None
        rd = cls(path)
        for sub in ("checkpoints", "eval"):
            (path / sub).mkdir(exist_ok=True)
        rd.write_meta({"kind": kind, "name": name, "created": time.time(), "status": "created",
                       "process": process_identity(),
                       "config_dir": str(Path(config_dir).resolve()) if config_dir else None,
                       "polar_version": _version()})
        return rd

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """An existing run directory (for resume / eval)."""
        path = Path(path)
        if not (path / META).is_file():
            raise RunDirError(f"{path} is not a polar run directory (no {META}); pass the directory `polar run` created.")
        return cls(path)

    # ------------------------------------------------------------------ layout
    @property
    def config_path(self) -> Path:
        return self.path / "config.resolved.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def eval_dir(self) -> Path:
        return self.path / "eval"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tb"

    # ------------------------------------------------------------------ metadata
    def read_meta(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / META).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RunDirError(f"{self.path / META} is unreadable: {e}") from None

    def write_meta(self, meta: dict[str, Any]) -> None:
        atomic_write_text(self.path / META, json.dumps(meta, indent=2))

    def update_meta(self, **changes: Any) -> None:
        meta = self.read_meta()
        meta.update(changes)
        self.write_meta(meta)

    def mark_running(self) -> None:
        """This process now owns the run (status ``starting`` until the trainer says ``running``); the previous
        ending (error, checkpoint) is cleared."""
        meta = self.read_meta()
        for key in ("error", "signal", "checkpoint", "ended"):
            meta.pop(key, None)
        meta.update(status="starting", process=process_identity(), started=time.time())
        self.write_meta(meta)

    def status(self) -> str:
        """The run's status, ``killed`` when it is recorded live but its process is gone (see ``run_status``)."""
        return run_status(self.path)["status"]

    def cut_metrics_after(self, step_key: str, last_step: int) -> int:
        """Cut the rows whose ``step_key`` is past ``last_step`` (and torn lines) from ``metrics.jsonl``; returns
        how many. A resumed run calls it with its checkpoint's step: a run that died after that checkpoint had
        logged rows the resumed run logs again. Rows without ``step_key`` (another phase's) stay. Atomic: a
        truncated copy replaces the file."""
        path = self.metrics_path
        if not path.is_file():
            return 0
        kept, cut = [], 0
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                cut += 1
                continue
            step = row.get(step_key) if isinstance(row, dict) else None
            if isinstance(step, (int, float)) and step > last_step:
                cut += 1
                continue
            kept.append(line)
        if cut:
            atomic_write_text(path, "".join(line + "\n" for line in kept))
            log.info("resume: cut %d metrics rows logged after the checkpoint (%s %d) from %s", cut, step_key,
                     last_step, path)
        return cut

    def write_config(self, text: str) -> None:
        atomic_write_text(self.config_path, text)

    def write_json(self, relpath: str, data: Any) -> Path:
        path = self.path / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(data, indent=2, default=_json_default))
        return path


def _json_default(o: Any):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _version() -> str:
    from polar import __version__

    return __version__
