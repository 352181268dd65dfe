"""Unreadable checkpoints: fall back to the newest one that loads; errors never advise weights_only=False."""

from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch

from polar.errors import CheckpointError
from polar.trainers.checkpoint import CheckpointManager, load_checkpoint


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_errors_never_repeat_the_weights_only_advice(tmp_path):
    torch.save({"evil": Evil()}, tmp_path / "object.pt")
    (tmp_path / "garbage.pt").write_bytes(pickle.dumps([1, 2], protocol=2) + os.urandom(64))
    (tmp_path / "torn.pt").write_bytes(b"PK\x03\x04 truncated")
    for name in ("object.pt", "garbage.pt", "torn.pt"):
        with pytest.raises(CheckpointError) as err:
            load_checkpoint(tmp_path / name)
        message = str(err.value)
        assert "weights_only" not in message and "\n" not in message, message
        assert str(tmp_path / name) in message
    with pytest.raises(CheckpointError, match=r"holds posix\.system"):
        load_checkpoint(tmp_path / "object.pt")


def test_load_newest_falls_back_past_unreadable_checkpoints(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path, keep=5)
    for i in (1, 2, 3):
        mgr.save(i, {"iteration": i})
    (tmp_path / "ckpt_00000003.pt").write_bytes(b"\x80\x02 torn")
    (tmp_path / "ckpt_00000002.pt").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="polar.trainers.checkpoint"):
        path, state = mgr.load_newest()
    assert path.name == "ckpt_00000001.pt" and state["iteration"] == 1
    text = caplog.text
    assert "ckpt_00000003.pt is unreadable" in text and "ckpt_00000002.pt is unreadable" in text
    assert "using checkpoint" in text and "ckpt_00000001.pt" in text and "weights_only" not in text

    (tmp_path / "ckpt_00000001.pt").write_bytes(b"nope")
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        mgr.load_latest()
