"""NaN/inf in observations, rewards or losses: a real `polar run` fails naming the source, or skips and counts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from polar.errors import NonFiniteError
from polar.trainers.finite import check_losses

HERE = Path(__file__).resolve().parent
CARTPOLE = HERE.parents[1] / "examples" / "cartpole_ppo.yaml"


def polar(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "polar.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def nan_config(tmp_path: Path, policy: str = "ppo", **connector) -> Path:
    shutil.copy(HERE / "connectors" / "nan_connector.py", tmp_path / "nan_connector.py")
    kwargs = {"n_steps": 16, "n_epochs": 1} if policy == "ppo" else {"learning_starts": 0, "train_freq": 4,
                                                                      "n_step_return": 3, "batch_size": 16}
    data = {"name": "nan", "harness": {"type": "custom", "connector_spec": {
                "module": "nan_connector", "class_name": "NanConnector", "config": connector}},
            "policy": {"type": policy, "kwargs": kwargs},
            "distribution": {"rollout_workers": 0, "envs_per_worker": 4},
            "total_env_steps": 1024, "logging": {"checkpoint_freq": 1, "tensorboard": False},
            "eval": {"at_end": False}}
    path = tmp_path / "nan.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("field", "words"), [("reward", "rewards hold nan"), ("obs", "observations hold inf")])
def test_a_nonfinite_value_fails_the_run_naming_its_source(tmp_path, field, words):
    run = tmp_path / "run"
    p = polar("run", "--config", nan_config(tmp_path, nan_field=field, nan_copy=2, nan_at=40), "--run-dir", run,
              "--no-progress")
    assert p.returncode == 1, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "connector NanConnector" in errors[0] and "env copy 2" in errors[0] and words in errors[0], errors[0]
    assert "nonfinite: skip" in errors[0]
    # copy 2's 40th step is in the 3rd fragment of 16 steps: the two before it trained and were checkpointed
    assert [r["iteration"] for r in rows(run)] == [1, 2]
    assert all(r["value_loss"] is not None for r in rows(run))


def test_skip_drops_poisoned_fragments_and_counts_them(tmp_path):
    run = tmp_path / "run"
    cfg = nan_config(tmp_path, nan_copy=1, nan_at=40, nan_forever=False)
    p = polar("run", "--config", cfg, "--run-dir", run, "--no-progress", "-o", "nonfinite=skip")
    assert p.returncode == 0, p.stderr[-3000:]
    last = rows(run)[-1]
    assert last["nonfinite_skipped_fragments"] == 1
    assert all(r["value_loss"] is not None and np.isfinite(r["value_loss"]) for r in rows(run))
    assert last["env_steps"] >= 1024


def test_skip_gives_up_on_an_env_that_only_sends_nan(tmp_path):
    p = polar("run", "--config", nan_config(tmp_path, nan_copy=0, nan_at=1), "--run-dir", tmp_path / "run",
              "--no-progress", "-o", "nonfinite=skip", "-o", "total_env_steps=100000")
    assert p.returncode == 1 and "fragments in a row" in p.stderr and "env copy 0" in p.stderr, p.stderr[-3000:]


def test_off_policy_runs_check_too(tmp_path):
    p = polar("run", "--config", nan_config(tmp_path, "dqn", nan_copy=3, nan_at=9), "--run-dir", tmp_path / "run",
              "--no-progress")
    assert p.returncode == 1 and "env copy 3: rewards hold nan" in p.stderr, p.stderr[-3000:]


def test_a_nonfinite_loss_names_the_term():
    check_losses({"pg_loss": torch.tensor(0.5), "value_loss": 1.0, "approx_kl": float("nan")}, 3, 768)
    with pytest.raises(NonFiniteError, match="loss term value_loss is nan at iteration 3"):
        check_losses({"pg_loss": torch.tensor(0.5), "value_loss": torch.tensor(float("nan"))}, 3, 768)
    with pytest.raises(NonFiniteError, match="loss term critic_loss is inf"):
        check_losses({"critic_loss": float("inf")}, 1, 10)
