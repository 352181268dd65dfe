"""`polar check`: passes good harnesses, fails broken ones with the right message and exit code."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest

from polar.cli.main import main as polar_main
from polar.harness.checker import check_env

from .conftest import CONNECTORS_DIR, KEYDOOR_DIR


@pytest.mark.parametrize("target", ["CartPole-v1", str(KEYDOOR_DIR / "polar_train_config.yaml")])
def test_good_harnesses_pass(target, capsys):
    assert polar_main(["check", target, "--steps", "120"]) == 0
    out = capsys.readouterr().out
    assert "conforms" in out and "reset(seed=s) is deterministic" in out


@pytest.mark.parametrize(
    ("class_name", "expected"),
    [
        ("OutOfSpaceConnector", "step() observation[0] = 5.0 is outside [0.0, 1.0]"),
        ("UnseededConnector", "the same trajectory from reset(seed=1) twice"),
        ("ThreeTupleConnector", "step returned a tuple of 3 items"),
        ("NoStepConnector", "has no 'step' method"),
    ],
)
def test_broken_connectors_fail_with_the_right_message(class_name, expected, capsys, monkeypatch):
    monkeypatch.chdir(CONNECTORS_DIR)
    assert polar_main(["check", f"sample_connectors:{class_name}", "--steps", "60"]) == 1
    out = " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping
    assert expected in out
    assert "expected:" in out and "received:" in out and "fix:" in out


def test_unknown_gymnasium_id_suggests_close_ids(capsys):
    assert polar_main(["check", "CartPol-v1"]) == 1
    assert "did you mean: CartPole-v1" in " ".join(capsys.readouterr().out.split())


def test_bad_config_key_is_one_line_error(tmp_path, capsys):
    p = tmp_path / "h.yaml"
    p.write_text("harness: {type: custom, connector_spec: {module: m, class_name: C, copies_per_proces: 2}}\n")
    assert polar_main(["check", str(p)]) == 1
    err = capsys.readouterr().err
    assert "harness.connector_spec.copies_per_proces" in err and "copies_per_process" in err


class _BadRewardEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float64), {}  # wrong dtype

    def step(self, action):
        return np.zeros(2, np.float32), np.array([1.0]), False, 0, {}  # reward array, truncated int


def test_check_env_library_reports_each_violation():
    report = check_env(_BadRewardEnv(), steps=20)
    text = "\n".join(str(v) for v in report.violations)
    assert not report.ok
    assert "dtype float64, the space says float32" in text
    assert "reward to be a real number" in text
    assert "truncated to be a bool" in text
    assert any("no episode ended" in w for w in report.warnings)


def test_checker_runs_on_a_node_connector(capsys):
    yaml = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "node_connector", "line_walk.yaml")
    assert polar_main(["check", yaml, "--steps", "80"]) == 0
