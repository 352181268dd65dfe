"""The planner (issue 37 item 6): a scripted planning engine's text becomes subgoals a PPO controller follows."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polar.inference.chat import chat_function
from polar.inference.scripted import ScriptedEngine
from polar.llm_roles.planner import PlanError, make_plan, parse_plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llm_planner"
sys.path.insert(0, str(EXAMPLE))

from planned_keydoor import DESCRIPTION, VOCABULARY, make_planned  # noqa: E402

PLAN = "Plan:\n1. Walk through the gap and step onto the key.\n2. Walk into the door."


def test_planner_text_becomes_ordered_subgoals() -> None:
    engine = ScriptedEngine.tiny([PLAN])
    plan = asyncio.run(make_plan(chat_function(engine, max_tokens=64), DESCRIPTION, VOCABULARY))
    assert plan == ["key", "door"]
    prompt = engine.tokenizer.decode(engine.requests[0].prompt_ids)
    assert "one per line, each naming exactly one of: key, door" in prompt


def test_plan_without_subgoal_or_with_two_on_a_line_is_refused() -> None:
    with pytest.raises(PlanError, match="names no subgoal; write one per line from: key, door"):
        parse_plan("I would explore.", VOCABULARY)
    with pytest.raises(PlanError, match=r"plan line 1 .* names 2 subgoals"):
        parse_plan("get the key and open the door", VOCABULARY)


def test_controller_sees_the_current_subgoal_and_is_paid_for_reaching_it() -> None:
    env = make_planned("key\ndoor", level=3, subgoal_reward=0.5)
    obs, info = env.reset(seed=3)
    assert obs["subgoal"].tolist() == [1.0, 0.0] and info["subgoals_done"] == 0
    game = env.unwrapped.game  # type: ignore[attr-defined]
    key = tuple(int(x) for x in np.argwhere(game.grid == 2)[0])
    moves = {0: (1, 0), 1: (-1, 0), 2: (0, 1), 3: (0, -1)}  # stand on the opposite side, then move onto the key
    action, (dr, dc) = next((a, d) for a, d in moves.items() if game.grid[key[0] + d[0], key[1] + d[1]] == 0)
    game.agent = (key[0] + dr, key[1] + dc)
    obs, reward, *_, info = env.step(action)
    assert info["subgoals_done"] == 1
    assert obs["subgoal"].tolist() == [0.0, 1.0]
    assert reward == pytest.approx(0.5 + 0.2 - 0.01)  # the bonus on top of the game's own key reward


def test_controller_trains_with_ppo_on_the_plan(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)])}
    res = subprocess.run([sys.executable, str(EXAMPLE / "run.py"), "--steps", "1024", "--", "--run-dir",
                          str(tmp_path / "run"), "--no-progress"], env=env, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "plan: 'key" in (tmp_path / "run" / "config.resolved.yaml").read_text()
