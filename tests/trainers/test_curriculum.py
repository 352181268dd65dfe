"""Curricula (``curriculum:``): stages advance on the training success rate, are logged, and resume where they were."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from polar.config.base import validate
from polar.config.run import RunConfig
from polar.errors import ConfigError
from polar.trainers.build import compose
from tests.learning.conftest import train_in_process

CONNECTORS = Path(__file__).parent / "connectors"


@pytest.fixture(autouse=True)
def _connector_beside_the_config(tmp_path):
    shutil.copy(CONNECTORS / "level_connector.py", tmp_path / "level_connector.py")


def _cfg(stuck_at: int, total: int, threshold: float = 1.0, window: int = 8, **extra) -> dict:
    return {
        "name": "curriculum",
        "harness": {"type": "custom", "connector_spec": {
            "module": "level_connector", "class_name": "LevelConnector",
            "config": {"level": 1, "stuck_at": stuck_at}}},
        "curriculum": {"stages": [{"kwargs": {"level": 1}}, {"kwargs": {"level": 2}}, {"kwargs": {"level": 3}}],
                       "threshold": threshold, "window": window},
        "policy": {"type": "ppo", "kwargs": {"n_steps": 8, "n_epochs": 1, "num_minibatches": 1}},
        "distribution": {"backend": "local", "rollout_workers": 0, "envs_per_worker": 2},
        "total_env_steps": total, "eval": {"episodes": 4, "num_envs": 2},
        "logging": {"checkpoint_freq": 1, "tensorboard": False}, **extra}


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_stages_advance_when_the_window_succeeds_and_each_advance_is_logged(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="polar.rollout.curriculum")
    # 16 episodes a batch (2 envs x 8 one-step episodes); a window of 24 fills in the second batch after a stage began
    result, trainer = train_in_process(tmp_path, _cfg(stuck_at=99, total=96, window=24))
    assert trainer.collector.stage == 2 and trainer.collector.advanced == 2
    stages = [r["curriculum/stage"] for r in _rows(trainer.run_dir.path)]
    assert stages == [0, 1, 1, 2, 2, 2]
    advances = [r.getMessage() for r in caplog.records if "->" in r.getMessage()]
    assert len(advances) == 2 and "stage 1 (level=2) -> 2 (level=3)" in advances[1]
    assert result["eval"]["return_mean"] == 3.0  # the final evaluation plays the stage trained last (reward = level)


def test_a_resumed_run_continues_at_the_stage_it_was_checkpointed_in(tmp_path):
    # level 1 succeeds, level 2 never does: the run sits at stage 1
    _, trainer = train_in_process(tmp_path, _cfg(stuck_at=2, total=64))
    assert trainer.collector.stage == 1
    again = compose(trainer.cfg.model_copy(update={"total_env_steps": 96}), trainer.run_dir, resume=True)
    again.restore()
    assert again.collector.stage == 1 and len(again.collector.successes) == 8  # the window came back too
    result = again.train()
    resumed = [r for r in _rows(trainer.run_dir.path) if r["env_steps"] > 64]
    assert resumed and all(r["curriculum/stage"] == 1 for r in resumed)
    assert result["eval"]["return_mean"] == 2.0  # level 2's env, rebuilt at resume
    # polar eval of the run plays the stage its checkpoint was training, not the config's stage 0
    from polar.trainers.build import evaluate_run

    shutil.copy(CONNECTORS / "level_connector.py", trainer.run_dir.path / "level_connector.py")  # the run's config dir
    assert evaluate_run(trainer.run_dir.path, episodes=4)[2]["return_mean"] == 2.0


def test_a_stage_naming_an_unknown_key_or_level_fails_at_start_naming_it(tmp_path):
    data = _cfg(stuck_at=99, total=32)
    data["curriculum"]["stages"][1] = {"kwargs": {"levle": 2}}
    with pytest.raises(Exception, match=r"curriculum.stages\[1\].kwargs.levle: not a key of harness.connector_spec"):
        validate(RunConfig, data)
    data["curriculum"]["stages"][1] = {"kwargs": {"level": 7}}
    with pytest.raises(ConfigError, match=r"curriculum.stages\[1\] \(\{'level': 7\}\): the env does not start: .*unknown level 7"):
        train_in_process(tmp_path, data)


@pytest.mark.parametrize("threshold", [0.0, 1.5, -0.2])
def test_a_threshold_outside_the_unit_interval_is_refused(threshold):
    with pytest.raises(Exception, match=r"'curriculum.threshold': .*a success rate in \(0, 1\] is needed"):
        validate(RunConfig, _cfg(stuck_at=99, total=32, threshold=threshold))
