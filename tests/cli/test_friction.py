"""Small things a new user trips over: --version, progress without a terminal, number overrides for string
fields, a batch larger than the rollout, a directory passed to --config, rounded summaries."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from polar import __version__
from polar.config import load_config
from polar.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "examples" / "cartpole_ppo.yaml"
KEYDOOR = ROOT / "examples" / "keydoor" / "demo.yaml"


def polar(*args):
    return subprocess.run([sys.executable, "-m", "polar.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_version():
    p = polar("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"polar {__version__}"


@pytest.mark.parametrize("flags", [["--no-progress", "--log-every-s", "0"], ["--log-every-s", "0"]])
def test_progress_is_logged_without_a_terminal(tmp_path, flags):
    """stderr is a pipe here, as under nohup or CI: progress comes as log lines, with and without --no-progress."""
    p = polar("run", "--config", CARTPOLE, "--run-dir", tmp_path / "r", "-o", "total_env_steps=768",
              "-o", "eval.at_end=false", "-o", "stop_reward=null", *flags)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [line for line in p.stderr.splitlines() if "polar.progress" in line]
    assert len(lines) == 3, p.stderr  # one per iteration with --log-every-s 0
    assert "768/768 env steps (100%)" in lines[-1]
    assert re.search(r"\d+ fps \(avg \d+\)", lines[-1]), lines[-1]
    finished = next(line for line in p.stderr.splitlines() if "finished:" in line)
    assert re.search(r"mean return -?\d+(\.\d{1,3})?$", finished), finished  # 4 significant digits, not 17


def test_a_number_override_for_a_string_field_is_its_text():
    cfg = load_config(KEYDOOR, ["harness.connector_spec.env.PORT=400", "harness.connector_spec.env.CODE=007",
                                "total_env_steps=5000", "name=2024"])
    assert cfg.harness.connector_spec.env == {"PORT": "400", "CODE": "007"}
    assert cfg.total_env_steps == 5000 and cfg.name == "2024"
    with pytest.raises(ConfigError, match=r"harness\.connector_spec\.env\.PORT"):
        load_config(KEYDOOR, ["harness.connector_spec.env.PORT=[1, 2]"])  # a list is still not a string
    with pytest.raises(ConfigError, match="total_env_steps"):
        load_config(KEYDOOR, ["total_env_steps=lots"])


def test_a_batch_larger_than_the_rollout_warns(tmp_path):
    p = polar("run", "--config", CARTPOLE, "--run-dir", tmp_path / "r", "--no-progress", "-o", "total_env_steps=256",
              "-o", "eval.at_end=false", "-o", "policy.kwargs.batch_size=4096")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "batch_size 4096 is larger than one rollout (256 env steps: 32 per env x 8 envs)" in p.stderr


def test_a_directory_passed_to_config_says_so(tmp_path):
    p = polar("run", "--config", ROOT / "examples", "--run-dir", tmp_path / "never")
    assert p.returncode == 1 and "is a directory, not a config file" in p.stderr, p.stderr
    assert "e.g. --config" in p.stderr and not (tmp_path / "never").exists()
