"""Trainers (the loops) and the run-directory / checkpoint utilities every trainer shares."""

from polar.trainers.checkpoint import CheckpointManager, load_checkpoint, save_checkpoint
from polar.trainers.run_dir import RunDir

__all__ = ["CheckpointManager", "RunDir", "load_checkpoint", "save_checkpoint"]
