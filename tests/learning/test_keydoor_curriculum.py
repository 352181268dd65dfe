"""The key-door curriculum (examples/keydoor/curriculum.yaml) advances from level 1 to level 3 and reaches >= 80%
success there: the final evaluation (100 deterministic episodes) plays the stage trained last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "keydoor" / "curriculum.yaml"


@pytest.mark.slow
def test_the_keydoor_curriculum_reaches_level_3_and_80_percent_success_there(tmp_path):
    run = tmp_path / "cur"
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(CONFIG), "--run-dir", str(run),
                        "--no-progress"], capture_output=True, text=True, timeout=3000, cwd=CONFIG.parent)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "stage 1 (level=2) -> 2 (level=3)" in p.stderr + p.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["curriculum/stage"] == 2
    result = json.loads((run / "eval" / "final.json").read_text())
    assert result["episodes"] == 100
    assert result["success_rate"] >= 0.8, result
