"""What a command prints outside a terminal can be copied: no line is broken at 80 columns. And an agent run
with LoRA prints no transformers FutureWarning (peft reads a name transformers 5 deprecated)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "examples" / "cartpole_ppo.yaml"


def test_paths_are_not_wrapped_outside_a_terminal(tmp_path):
    run_dir = tmp_path / ("a-run-folder-whose-path-is-longer-than-eighty-columns-" + "x" * 40)
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(CARTPOLE), "--run-dir",
                        str(run_dir), "-o", "total_env_steps=256", "-o", "eval.at_end=false", "-o", "stop_reward=null",
                        "--no-progress"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"run dir: {run_dir}\n" in p.stderr, p.stderr[:2000]


def test_lora_policy_prints_no_future_warning():
    from polar.config.grpo import LoraConfig
    from polar.inference import load_engine
    from polar.models.llm_policy import LLMPolicy

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LLMPolicy.from_engine(load_engine("tiny"), LoraConfig())
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]


def test_eval_and_export_print_long_paths_on_one_line_outside_a_terminal(tmp_path):
    """``polar eval --record`` and ``polar export`` print the folder they wrote; outside a terminal rich used to
    break it at 80 columns, so it could not be copied from a log."""
    from tests.deploy.conftest import run_config, write_run

    long = "a-folder-whose-path-is-longer-than-eighty-columns-" + "y" * 40
    run = write_run(tmp_path / long / "run", run_config("cartpole")).path
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    rec = subprocess.run([sys.executable, "-m", "polar.cli.main", "eval", str(run), "--record", "1"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert rec.returncode == 0, rec.stderr[-3000:]
    [episodes] = list((run / "episodes").iterdir())
    assert f"recorded 1 episodes: {episodes}\n" in rec.stderr, rec.stderr[-2000:]
    out = tmp_path / long / "export"
    exp = subprocess.run([sys.executable, "-m", "polar.cli.main", "export", str(run), "--out", str(out), "--samples", "4"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert exp.returncode == 0, exp.stderr[-3000:]
    assert f"to {out}\n" in exp.stderr, exp.stderr[-2000:]
