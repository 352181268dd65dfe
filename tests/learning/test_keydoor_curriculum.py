"""The key-door curriculum (examples/keydoor/curriculum.yaml) on the real connector: level 1 reaches the 80%
threshold over 100 training episodes and the run moves to level 2 within 100k env steps (it did at 25k-32k in
docs/benchmarks.md, "Key-door curriculum"). Level 3 at >= 80%, the issue's target, is not reached at this budget
on this box (the same page), so no test asserts it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "keydoor" / "curriculum.yaml"


@pytest.mark.slow
def test_the_keydoor_curriculum_masters_level_1_and_moves_to_level_2(tmp_path):
    run = tmp_path / "cur"
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(CONFIG), "--run-dir", str(run),
                        "--no-progress", "-o", "total_env_steps=100000", "-o", "eval.at_end=false"],
                       capture_output=True, text=True, timeout=3000, cwd=CONFIG.parent)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "stage 0 (level=1) -> 1 (level=2)" in p.stderr + p.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["curriculum/stage"] >= 1
