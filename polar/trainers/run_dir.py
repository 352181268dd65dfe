"""The run directory every kind of run writes (PPO, GRPO, ...), so eval, resume and dashboards read them alike::

    runs/<name>-<YYYYmmdd-HHMMSS>/
      run.json              who made it: kind, name, config_dir, status, polar version
      config.resolved.yaml  the validated config with every default filled in
      metrics.jsonl         one JSON object per logged iteration
      tb/                   TensorBoard event files
      checkpoints/          ckpt_<iteration>.pt + LATEST
      eval/                 evaluation results as JSON
      control/              ray: `polar scale` requests (scale.json) and their answers (scale.applied.json)
      scale_events.jsonl    ray: every rollout-worker resize, by the autoscale rule or a request, with its reason
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
