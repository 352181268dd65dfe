"""`polar run / eval / resume` as a user runs them: real subprocesses, real run directories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polar.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "examples" / "cartpole_ppo.yaml"
SEED_CONFIG = ROOT / "examples" / "keydoor" / "polar_train_config.yaml"


def polar(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "polar.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def test_run_writes_the_run_dir_and_eval_reads_it(tmp_path):
    run = tmp_path / "r"
    p = polar("run", "--config", CARTPOLE, "--run-dir", run, "--no-progress", "-o", "total_env_steps=768",
              "-o", "logging.checkpoint_freq=1", "-o", "eval.episodes=3")
    assert p.returncode == 0, p.stderr
    for name in ("config.resolved.yaml", "metrics.jsonl", "run.json", "checkpoints/LATEST", "eval/final.json"):
        assert (run / name).exists(), name
    assert list((run / "tb").glob("events.out.tfevents.*"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in rows] == [256, 512, 768]
    for key in ("env_steps", "time_s", "fps", "episode_reward_mean", "episode_len_mean", "pg_loss", "value_loss", "entropy"):
        assert key in rows[-1], key
    assert len(list((run / "checkpoints").glob("ckpt_*.pt"))) == 3  # keep_checkpoints
    resolved = load_config(run / "config.resolved.yaml")
    assert resolved.total_env_steps == 768 and resolved.policy.kwargs.n_epochs == 20
    final = json.loads((run / "eval" / "final.json").read_text())
    assert final["episodes"] == 3 and final["success_rate"] is None

    p = polar("eval", run, "--episodes", "4")
    assert p.returncode == 0, p.stderr
    assert "return mean" in p.stdout
    evals = sorted((run / "eval").glob("eval_ckpt_*.json"))
    assert len(evals) == 1 and json.loads(evals[0].read_text())["episodes"] == 4

    ckpt = sorted((run / "checkpoints").glob("ckpt_*.pt"))[0]
    assert polar("eval", ckpt, "--episodes", "2").returncode == 0

    again = polar("run", "--config", CARTPOLE, "--run-dir", run, "--no-progress")
    assert again.returncode == 1
    assert "already holds another run" in again.stderr and "polar resume" in again.stderr


def test_invalid_config_fails_before_anything_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CARTPOLE.read_text().replace("n_epochs: 20", "n_epoch: 20"))
    p = polar("run", "--config", bad, "--run-dir", tmp_path / "never", "--no-progress")
    assert p.returncode == 1
    assert "policy.kwargs.n_epoch" in p.stderr and "did you mean: n_epochs" in p.stderr
    assert not (tmp_path / "never").exists()
    p = polar("run", "--config", CARTPOLE, "-o", "distribution.rollout_workers=many", "--run-dir", tmp_path / "never")
    assert p.returncode == 1 and "distribution.rollout_workers" in p.stderr
    assert not (tmp_path / "never").exists()


def test_seed_document_config_loads_as_written():
    cfg = load_config(SEED_CONFIG)
    assert cfg.agent.type == "custom" and cfg.agent.kwargs == {"obs_dim": 100, "action_dim": 4}
    assert cfg.distribution.rollout_workers == 16 and cfg.distribution.num_gpus == 1
    assert cfg.distribution.coordinator_address == "auto" and cfg.logging.checkpoint_freq == 100
    assert cfg.policy.kwargs.learning_rate == pytest.approx(3e-4)


@pytest.mark.slow
def test_seed_document_config_runs_unchanged(tmp_path):
    """16 worker processes, num_gpus 1 with no GPU (a warning), coordinator 'auto' (ignored locally)."""
    run = tmp_path / "seed"
    p = polar("run", "--config", SEED_CONFIG, "--run-dir", run, "--no-progress", "-o", "total_env_steps=4096",
              "-o", "eval.episodes=4", cwd=tmp_path, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "distribution.num_gpus=1 but CUDA is not available here; the learner runs on CPU" in p.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] >= 4096 and rows[-1]["episode_len_mean"] is not None
    assert json.loads((run / "eval" / "final.json").read_text())["success_rate"] is not None
