"""The key-door curricula on the real connector (docs/benchmarks.md, "Key-door curriculum").

``curriculum.yaml`` (flat observation, MLP, levels 1 -> 2 -> 3): level 1 reaches the 80% threshold over 100
training episodes and the run moves to level 2 within 100k env steps; it stays there. ``curriculum_cnn.yaml``
(egocentric image, CNN, steps between the levels): the run reaches level 3 and passes 80% success there, in the
training window and in the final argmax evaluation, within its 600k env steps (issue 36's bar)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "keydoor" / "curriculum.yaml"
CNN_CONFIG = CONFIG.with_name("curriculum_cnn.yaml")


def _run(config: Path, run: Path, *overrides: str, timeout_s: int) -> tuple[str, list[dict]]:
    args = [a for o in overrides for a in ("-o", o)]
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(config), "--run-dir", str(run),
                        "--no-progress", *args], capture_output=True, text=True, timeout=timeout_s, cwd=config.parent)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stderr + p.stdout, [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_cnn_curriculum_config_trains_on_the_real_connector(tmp_path):
    """A smoke run of curriculum_cnn.yaml: the egocentric image reaches the CNN encoder through the connector, and
    the curriculum's metrics are logged from stage 0."""
    out, rows = _run(CNN_CONFIG, tmp_path / "smoke", "total_env_steps=2048", "eval.at_end=false", timeout_s=300)
    assert "curriculum: stage 0 of 4 (level 1)" in out
    assert rows[-1]["env_steps"] >= 2048 and rows[-1]["curriculum/stage"] == 0


@pytest.mark.slow
def test_the_cnn_curriculum_reaches_level_3_and_80_percent_success_there(tmp_path):
    """Issue 36's bar on seed 0: every stage advances (level 3 from about 100k env steps in docs/benchmarks.md) and
    at 600k env steps both the last 100 training episodes (sampled actions) and the final evaluation (200 episodes,
    argmax actions, eval seeds from 10000) at level 3 succeed at >= 80%."""
    run = tmp_path / "cnn"
    out, rows = _run(CNN_CONFIG, run, "seed=0", timeout_s=3000)
    assert "stage 3 (level 3 without the split wall) -> 4 (level 3)" in out
    assert rows[-1]["curriculum/stage"] == 4 and rows[-1]["curriculum/success_rate"] >= 0.8
    final = json.loads((run / "eval" / "final.json").read_text())
    assert final["episodes"] == 200 and final["deterministic"] and final["success_rate"] >= 0.8


@pytest.mark.slow
def test_the_keydoor_curriculum_masters_level_1_and_moves_to_level_2(tmp_path):
    out, rows = _run(CONFIG, tmp_path / "cur", "total_env_steps=100000", "eval.at_end=false", timeout_s=3000)
    assert "stage 0 (level=1) -> 1 (level=2)" in out
    assert rows[-1]["curriculum/stage"] >= 1
