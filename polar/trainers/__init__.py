"""Trainers (the loops) and the run-directory / checkpoint utilities every trainer shares.

The names below are imported on first use (PEP 562): ``polar.trainers.preflight`` and the config checks of
``polar run`` must not pay for torch before they can say what is wrong with a config."""

from typing import Any

__all__ = ["CheckpointManager", "RunDir", "load_checkpoint", "save_checkpoint"]

_WHERE = {"CheckpointManager": "polar.trainers.checkpoint", "load_checkpoint": "polar.trainers.checkpoint",
          "save_checkpoint": "polar.trainers.checkpoint", "RunDir": "polar.trainers.run_dir"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'polar.trainers' has no attribute {name!r}")
