"""RND on MiniGrid DoorKey-5x5 (reward only at the goal): PPO + RND reaches the goal in >= 80% of 100 sampled
evaluation episodes at the budget of examples/minigrid/doorkey_rnd.yaml (100k env steps), on each of 3 seeds. A
MiniGrid episode reached the goal when its return is > 0 (the env pays ``1 - 0.9 * steps / max_steps`` there and
nothing elsewhere). Plain PPO at the same budget solved all 3 seeds as well (docs/benchmarks.md, "RND on MiniGrid
DoorKey"), so the issue's "plain PPO < 20%" is not asserted: it does not hold on this task (docs/exploration.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "minigrid"


def _goal_rate(tmp_path: Path, config: str, seed: int) -> float:
    run = tmp_path / f"{config}_{seed}"
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(EXAMPLES / f"{config}.yaml"),
                        "--run-dir", str(run), "--no-progress", "-o", f"seed={seed}"],
                       capture_output=True, text=True, timeout=3000)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((run / "eval" / "final.json").read_text())
    assert result["episodes"] == 100 and not result["deterministic"]
    return sum(r > 0 for r in result["returns"]) / len(result["returns"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_with_rnd_reaches_the_doorkey_goal(tmp_path, seed):
    assert _goal_rate(tmp_path, "doorkey_rnd", seed) >= 0.8
