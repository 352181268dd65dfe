"""A manager and three skills learn key-door level 3 (examples/hierarchy/keydoor_hierarchical.yaml) through
`polar run`, and `polar eval` plays the checkpoint with both levels (docs/hierarchy.md;
docs/benchmarks.md compares it with flat PPO, 3 seeds each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hierarchy"


@pytest.mark.slow
def test_the_hierarchical_keydoor_example_learns_its_skills_and_the_task(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "hier"
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(EXAMPLE / "keydoor_hierarchical.yaml"),
                        "--run-dir", str(run), "--no-progress", "-o", "eval.at_end=false", "-o", "eval.every_n_iterations=0"],
                       capture_output=True, text=True, timeout=3000, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] == 102_400
    first, last = rows[:10], rows[-10:]
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    # the gap skill learns to reach its subgoal, the key skill improves, and the task's success rises above the
    # random policy's (about 0.07 on this level in the first iterations)
    assert mean(first, "options/reached/gap") < 0.4 and mean(last, "options/reached/gap") > 0.7, rows[-1]
    assert mean(last, "options/reached/key") > mean(first, "options/reached/key") + 0.15, rows[-1]
    assert mean(last, "success_rate") >= 0.15 > mean(first, "success_rate"), rows[-1]
    # the run names the example's env module: this test made it, so it trusts it (docs/security.md)
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "eval", str(run), "--episodes", "40", "--stochastic",
                        "--trust-code"], capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(next((run / "eval").glob("eval_ckpt_*.json")).read_text())
    assert result["episodes"] == 40 and not result["deterministic"]
    assert set(result["picked"]) == {"key", "gap", "door"}
