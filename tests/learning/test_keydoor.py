"""PPO solves key-door level 1 through its connector: >= 90% success in `polar eval` (deterministic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "examples" / "keydoor" / "demo.yaml"


@pytest.mark.slow
def test_keydoor_level1_demo_config_reaches_90_percent_success(tmp_path):
    run = tmp_path / "kd"
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(DEMO), "--run-dir", str(run),
                        "--no-progress", "-o", "eval.at_end=false"], capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, p.stderr[-3000:]
    # the run names the demo's connector module: this test made it, so it trusts it (docs/security.md)
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "eval", str(run), "--episodes", "100", "--trust-code"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(next((run / "eval").glob("eval_ckpt_*.json")).read_text())
    assert result["episodes"] == 100 and result["deterministic"]
    assert result["success_rate"] >= 0.9, result
