"""Checkpoints: atomic, weights-only, complete (model, optimizer, normalizers, RNG, counters)."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from polar.errors import CheckpointError, RunDirError
from polar.trainers.checkpoint import CheckpointManager, load_checkpoint
from polar.trainers.run_dir import RunDir
from tests.learning.conftest import train_in_process
from tests.learning.envs import register


def test_interrupted_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    mgr.save(1, {"x": torch.ones(3), "iteration": 1})
    # a crash mid-save leaves only a temp file behind; LATEST still names the complete one
    (tmp_path / ".ckpt_00000002.pt.tmp-999").write_bytes(b"PK\x03\x04 truncated")
    assert mgr.load_latest()["iteration"] == 1
    # a truncated final file (e.g. disk full) is reported, not half-loaded
    (tmp_path / "ckpt_00000003.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(tmp_path / "ckpt_00000003.pt")
    mgr.save(4, {"iteration": 4})
    mgr.save(5, {"iteration": 5})
    assert [p.name for p in mgr.all()] == ["ckpt_00000004.pt", "ckpt_00000005.pt"]  # pruned to keep=2
    assert mgr.load_latest()["iteration"] == 5


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoints_never_unpickle_arbitrary_objects(tmp_path):
    path = tmp_path / "ckpt_00000001.pt"
    torch.save({"evil": Evil()}, path)
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    with open(tmp_path / "raw.pt", "wb") as f:
        pickle.dump(Evil(), f, protocol=2)
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "raw.pt")


def test_run_dir_refuses_a_used_directory(tmp_path):
    RunDir.create("a", tmp_path / "r")
    with pytest.raises(RunDirError, match="already holds another run"):
        RunDir.create("b", tmp_path / "r")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="already holds files"):
        RunDir.create("b", tmp_path / "other")
    with pytest.raises(RunDirError, match="not a polar run directory"):
        RunDir.open(tmp_path / "other")


def test_checkpoint_holds_normalizers_optimizer_rng_and_counters(tmp_path):
    register()
    _res, trainer = train_in_process(tmp_path, {
        "name": "norm", "total_env_steps": 1024, "harness": {"type": "gymnasium", "id": "PolarReachTarget-v0"},
        "policy": {"type": "ppo", "kwargs": {"n_steps": 64, "n_epochs": 4, "num_minibatches": 4, "normalize_obs": True,
                                             "normalize_reward": True}},
        "distribution": {"envs_per_worker": 4}, "logging": {"tensorboard": False, "checkpoint_freq": 1},
        "eval": {"at_end": False},
    })
    state = load_checkpoint(trainer.checkpoints.latest())
    assert state["env_steps"] == 1024 and state["iteration"] == 4 and state["policy_version"] == 4
    assert state["policy"]["obs_norm.norm.count"].item() == pytest.approx(1024, rel=1e-3)
    assert state["reward_norm"]["count"].item() == pytest.approx(1024, rel=1e-3)
    assert state["learner"]["optimizer"]["step"] == 4 * 4 * 4  # iterations x epochs x minibatches
    assert set(state["rng"]) == {"python", "numpy", "torch"}
    mean = state["policy"]["obs_norm.norm.mean"]
    assert mean.shape == (2,) and torch.all(mean.abs() < 1)
    # a fresh trainer resumed from it continues with the same statistics and counters
    from polar.trainers.build import compose

    again = compose(trainer.cfg.model_copy(update={"total_env_steps": 1280}), trainer.run_dir, resume=True)
    res2 = again.train()
    assert res2["env_steps"] == 1280 and again.iteration == 5
    assert again.learner.parts.policy.obs_norm.norm.count.item() == pytest.approx(1280, rel=1e-3)
