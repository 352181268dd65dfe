"""Atomic checkpoints of plain state (tensors, dicts, lists, numbers, strings): no arbitrary pickles.

``save_checkpoint`` writes to a temp file, fsyncs, then ``os.replace``s it into place, and only then
moves the ``LATEST`` pointer; a crash at any point leaves the previous checkpoint as the one that
loads. ``load_checkpoint`` uses ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polar.errors import CheckpointError
from polar.trainers.run_dir import atomic_write_text

LATEST = "LATEST"
_NAME = re.compile(r"^ckpt_(\d+)\.pt$")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); it may be truncated or not a polar checkpoint") from None


class CheckpointManager:
    """``ckpt_<iteration>.pt`` files in one directory, a ``LATEST`` pointer, and pruning to ``keep``."""

    def __init__(self, directory: str | Path, keep: int = 3) -> None:
        self.dir = Path(directory)
        self.keep = keep

    def save(self, iteration: int, state: dict[str, Any]) -> Path:
        path = save_checkpoint(self.dir / f"ckpt_{iteration:08d}.pt", state)
        atomic_write_text(self.dir / LATEST, path.name + "\n")
        self._prune()
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
        path = self.latest()
        if path is None:
            raise CheckpointError(f"no checkpoint in {self.dir}; the run stopped before its first checkpoint")
        return load_checkpoint(path)

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
