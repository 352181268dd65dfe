"""Defects found while auditing (issue 12): the policy version counts real updates only, checkpoints are
written atomically, and DQN/SAC keep one replay file per kept checkpoint."""

from __future__ import annotations

import dataclasses

from polar.config import RunConfig, validate
from polar.rollout.backends.base import make_backend
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir

STALE_AT = 3  # the 3rd fragment arrives from weights far older than max_policy_lag


class StaleThirdFragment:
    """The real in-learner backend, except that its 3rd fragment is tagged as acted by long-gone weights
    (what a worker stuck on old weights sends); every publish is recorded."""

    def __init__(self, backend) -> None:
        self.inner = backend
        self.fragments = 0
        self.published: list[int] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self, policy_state, version=0, policy=None):
        self.inner.start(policy_state, version, policy=policy)

    def publish_weights(self, state_dict, version):
        self.published.append(version)
        self.inner.publish_weights(state_dict, version)

    def next_fragment(self, timeout_s=None):
        frag = self.inner.next_fragment(timeout_s)
        self.fragments += 1
        if self.fragments == STALE_AT:
            frag = dataclasses.replace(frag, policy_version=frag.policy_version - 10)
        return frag

    def close(self):
        self.inner.close()


def test_appo_dropping_a_stale_fragment_does_not_bump_the_policy_version(tmp_path):
    cfg = validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "policy": {"type": "appo", "kwargs": {"n_steps": 8, "max_policy_lag": 2}},
        "distribution": {"backend": "local", "rollout_workers": 0, "envs_per_worker": 2},
        "total_env_steps": 5 * 8 * 2,
        "logging": {"checkpoint_freq": 0, "tensorboard": False, "progress_bar": False},
        "eval": {"at_end": False},
    })
    wrapped: list[StaleThirdFragment] = []

    def factory(cfg, fragment_steps, seed, config_dir=None, on_policy=False):
        wrapped.append(StaleThirdFragment(make_backend(cfg, fragment_steps, seed, config_dir=config_dir)))
        return wrapped[0]

    seen: list[tuple[int, dict]] = []
    trainer = compose(cfg, RunDir.create("appo", tmp_path / "run"), backend_factory=factory,
                      on_iteration=lambda m: seen.append((trainer.version, dict(m))))
    trainer.train()
    versions = [v for v, _ in seen]
    assert len(seen) == 5
    # updates on fragments 1, 2, 4, 5; the stale 3rd is dropped and leaves the version where it was
    assert versions == [1, 2, 2, 3, 4]
    assert wrapped[0].published == [1, 2, 3, 4]  # nothing was published for the dropped fragment
    dropped = seen[STALE_AT - 1][1]
    assert dropped["update_skipped"] == 1.0 and dropped["stale_dropped"] == 1.0
    assert dropped["policy_lag"] == 10  # measured against the version that did not move (2, not 3)
    assert all(m["update_skipped"] == 0.0 for i, (_, m) in enumerate(seen) if i != STALE_AT - 1)


# ------------------------------------------------------------------ checkpoints: killed mid-write

KILLED_MID_WRITE = r"""
import resource, signal, sys
import torch
from polar.trainers.checkpoint import CheckpointManager, save_checkpoint

directory = sys.argv[1]
manager = CheckpointManager(directory, keep=5)
manager.save(1, {"w": torch.full((1000,), 1.0), "iteration": 1})
save_checkpoint(f"{directory}/ckpt_00000002.pt", {"w": torch.full((10,), 2.0), "iteration": 2})  # to be overwritten
# from here a file may grow to 1 MiB; past that the kernel kills this process (SIGXFSZ) in the middle of a write
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
manager.save(2, {"w": torch.zeros(4_000_000), "iteration": 2})  # 16 MB
print("the save finished", flush=True)
"""


def test_a_save_killed_mid_write_leaves_the_old_checkpoint_whole(tmp_path):
    """The kernel kills the saving process in the middle of writing ckpt_2 over an older ckpt_2. An atomic save
    leaves the old file whole (the half-written temp file never got its name); an in-place write leaves a
    truncated ckpt_2 that no longer loads."""
    import signal
    import subprocess
    import sys

    import torch

    from polar.trainers.checkpoint import CheckpointManager, load_checkpoint

    directory = tmp_path / "checkpoints"
    res = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(directory)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == -signal.SIGXFSZ, (res.returncode, res.stdout, res.stderr[-2000:])
    assert "the save finished" not in res.stdout
    old = load_checkpoint(directory / "ckpt_00000002.pt")  # what was there before the killed save: whole
    assert old["iteration"] == 2 and torch.equal(old["w"], torch.full((10,), 2.0))
    manager = CheckpointManager(directory)
    assert manager.latest() == directory / "ckpt_00000001.pt"  # LATEST never moved to the unfinished save
    assert torch.equal(manager.load_latest()["w"], torch.full((1000,), 1.0))


# ------------------------------------------------------------------ DQN/SAC: one replay file per kept checkpoint


def test_off_policy_resume_from_an_older_checkpoint_restores_that_checkpoints_replay(tmp_path, caplog):
    """Three checkpoints, two kept: each kept one has its own replay file, pruned with it. When the newest is
    torn, resume falls back to the one before and must find that checkpoint's buffer, not fail on a missing
    file or take the newer buffer (transitions the restored weights never saw)."""
    import logging

    from polar.trainers.build import compose
    from polar.trainers.checkpoint import load_checkpoint
    from tests.trainers.test_off_policy import off_policy_cfg, replay_files, replay_header, train

    cfg = off_policy_cfg("dqn", total=3000)
    cfg = cfg.model_copy(update={"logging": cfg.logging.model_copy(update={"keep_checkpoints": 2})})
    path = tmp_path / "run"
    train(cfg, path)
    ckpts = path / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("ckpt_*.pt")) == ["ckpt_00000002.pt", "ckpt_00000003.pt"]
    assert replay_files(path) == ["replay_00000002.npz", "replay_00000003.npz"]  # iteration 1's went with its ckpt
    assert load_checkpoint(ckpts / "ckpt_00000002.pt")["replay_file"] == "replay_00000002.npz"
    assert replay_header(ckpts / "replay_00000002.npz")["size"] == 2000

    newest = ckpts / "ckpt_00000003.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # torn, as by a crash of the disk under it
    with caplog.at_level(logging.INFO, logger="polar.rollout.backends.replay"):
        resumed = compose(cfg.model_copy(update={"total_env_steps": 4000}), RunDir.open(path), resume=True)
        resumed.restore()
    try:
        assert resumed.env_steps == 2000 and resumed.iteration == 2
        assert len(resumed.collector.replay) == 2000  # the buffer of checkpoint 2, not 3's 3000 transitions
        assert "replay buffer restored: 2000 transitions" in caplog.text
    finally:
        resumed.collector.close()
