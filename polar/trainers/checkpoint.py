"""Atomic checkpoints of plain state (tensors, dicts, lists, numbers, strings): no arbitrary pickles.

``save_checkpoint`` writes to a temp file, fsyncs, then ``os.replace``s it into place, and only then
moves the ``LATEST`` pointer; a crash at any point leaves the previous checkpoint as the one that
loads. ``load_checkpoint`` uses ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polar.errors import CheckpointError, os_cause
from polar.trainers.run_dir import atomic_write_text
from polar.types import SideFile

log = logging.getLogger(__name__)

LATEST = "LATEST"
_NAME = re.compile(r"^ckpt_(\d+)\.pt$")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically. A failed write (disk full, read-only directory) removes its temp file and
    raises one ``CheckpointError`` naming the path and the cause; earlier checkpoints are untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    out = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            out = _RecordingWriter(f)
            torch.save(state, out)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        cause = out.error if out is not None and out.error is not None else e
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if not isinstance(cause, OSError):
            raise
        raise CheckpointError(f"cannot write checkpoint {path}: {os_cause(cause)}; earlier checkpoints are intact. "
                              "Free disk space or make the run directory writable, then `polar resume` it") from None
    return path


class _RecordingWriter:
    """A file wrapper that keeps the first ``OSError`` of a write: ``torch.save`` turns it into a RuntimeError
    ("unexpected pos ...") that no longer says the disk is full or the directory read-only."""

    def __init__(self, f) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} is unreadable: {_load_reason(e)}") from None


def _load_reason(e: Exception) -> str:
    """Why ``torch.load`` refused a file, in one clause, without PyTorch's advice to load with weights_only=False
    (that would run whatever code the file holds)."""
    text = str(e)
    if "GLOBAL" in text:
        found = re.search(r"GLOBAL ([\w.]+)", text)
        what = found.group(1) if found else "a Python object"
        return (f"it holds {what}, not just tensors and plain values; polar never unpickles objects, since that "
                "can run code. Use a checkpoint polar wrote")
    keep = [line.strip() for line in text.splitlines()
            if line.strip() and not any(w in line for w in ("weights_only", "Weights only", "torch.load", "file an issue"))]
    detail = keep[0].removeprefix("WeightsUnpickler error:").strip() if keep else type(e).__name__
    detail = detail.split(". This is an internal")[0].rstrip(".")[:160] or type(e).__name__
    return f"{detail}; it is truncated, corrupt or not a polar checkpoint"


class CheckpointManager:
    """``ckpt_<iteration>.pt`` files in one directory, a ``LATEST`` pointer, and pruning to ``keep``."""

    def __init__(self, directory: str | Path, keep: int = 3) -> None:
        self.dir = Path(directory)
        self.keep = keep
        # A write that failed while the directory was read-only could not remove its temp file then.
        for stale in self.dir.glob(".*.tmp-*") if self.dir.is_dir() else ():
            with contextlib.suppress(OSError):
                stale.unlink()

    def save(self, iteration: int, state: dict[str, Any]) -> Path:
        """``ckpt_<iteration>.pt``; a ``SideFile`` value in ``state`` is written first, beside it, as
        ``<prefix>_<iteration>.<suffix>``, and the checkpoint names that file in its place; so is one a section down
        (the learner's: MBPO's model buffer). Every kept checkpoint keeps its own side files (a resume that falls
        back to an older checkpoint needs *its* files); they go when their checkpoint is pruned
        (``logging.keep_checkpoints``)."""
        sides: list[SideFile] = []

        def write_sides(part: dict[str, Any], depth: int) -> dict[str, Any]:
            out = dict(part)
            for key, value in part.items():
                if isinstance(value, SideFile):
                    self.dir.mkdir(parents=True, exist_ok=True)
                    side_path = self.dir / f"{value.prefix}_{iteration:08d}.{value.suffix}"
                    value.write(side_path)
                    out[key] = side_path.name
                    sides.append(value)
                elif isinstance(value, dict) and depth == 0:
                    out[key] = write_sides(value, 1)
            return out

        state = write_sides(state, 0)
        path = save_checkpoint(self.dir / f"ckpt_{iteration:08d}.pt", state)
        atomic_write_text(self.dir / LATEST, path.name + "\n")
        self._prune()
        for side in sides:
            kept = {f"{side.prefix}_{int(p.stem.removeprefix('ckpt_')):08d}.{side.suffix}" for p in self.all()}
            for old in self.dir.glob(f"{side.prefix}_*.{side.suffix}"):
                if old.name not in kept:
                    old.unlink(missing_ok=True)
        return path

    def all(self) -> list[Path]:
        found = [(int(m.group(1)), p) for p in self.dir.glob("ckpt_*.pt") if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        pointer = self.dir / LATEST
        if pointer.is_file():
            cand = self.dir / pointer.read_text().strip()
            if cand.is_file():
                return cand
        files = self.all()
        return files[-1] if files else None

    def load_latest(self) -> dict[str, Any]:
        return self.load_newest()[1]

    def load_newest(self) -> tuple[Path, dict[str, Any]]:
        """(path, state) of the newest checkpoint that loads. An unreadable newer one (torn by a crash, corrupt)
        is named in a warning and skipped, so a run resumes from the one before it."""
        latest = self.latest()
        if latest is None:
            raise CheckpointError(f"no checkpoint in {self.dir}; the run stopped before its first checkpoint")
        candidates = [latest] + [p for p in reversed(self.all()) if p != latest]
        unreadable: list[Path] = []
        for path in candidates:
            try:
                state = load_checkpoint(path)
            except CheckpointError as e:
                log.warning("%s", e)
                unreadable.append(path)
                continue
            if unreadable:
                log.warning("using checkpoint %s instead: the newer %s unreadable", path,
                            " and ".join(p.name for p in unreadable) + (" is" if len(unreadable) == 1 else " are"))
            return path, state
        raise CheckpointError(f"no readable checkpoint in {self.dir}: {', '.join(p.name for p in unreadable)} "
                              "are all unreadable (see the warnings above)")

    def _prune(self) -> None:
        files = self.all()
        for p in files[: max(0, len(files) - self.keep)]:
            p.unlink(missing_ok=True)


def rng_state() -> dict[str, Any]:
    """Python, numpy (legacy global) and torch RNG states as weights_only-loadable values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py = random.getstate()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
