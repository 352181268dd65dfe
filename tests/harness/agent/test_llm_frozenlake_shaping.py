"""The shaping functions of examples/llm_frozenlake.yaml on whole FrozenLake-v1 episodes (4x4, not slippery):
what each kind of episode returns, since GRPO compares exactly those returns."""

import importlib.util
from pathlib import Path

import gymnasium as gym
import pytest

ROOT = Path(__file__).resolve().parents[3]
LEFT, DOWN, RIGHT, UP = range(4)


@pytest.fixture(scope="module")
def shaping():
    spec = importlib.util.spec_from_file_location("llm_frozenlake_shaping", ROOT / "examples" / "llm_frozenlake_shaping.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shaped_return(fn, actions: list[int]) -> tuple[float, bool]:
    env = gym.make("FrozenLake-v1", map_name="4x4", is_slippery=False)
    obs, info = env.reset(seed=0)
    total, reached = 0.0, False
    for action in actions:
        next_obs, reward, terminated, truncated, info = env.step(action)
        total += fn(obs, action, reward, next_obs, terminated, info)
        reached = reached or reward > 0
        obs = next_obs
        if terminated or truncated:
            break
    env.close()
    return total, reached


@pytest.mark.parametrize("actions", [[DOWN, DOWN, DOWN], [RIGHT, DOWN], [DOWN, RIGHT], [RIGHT, RIGHT, RIGHT, DOWN],
                                     [RIGHT, RIGHT, DOWN, RIGHT]])
def test_every_hole_returns_the_penalty_alone_wherever_it_is(shaping, actions):
    total, reached = shaped_return(shaping.progress_lost_in_holes, actions)
    assert not reached and total == pytest.approx(-shaping.HOLE_PENALTY)


def test_progress_kept_in_a_hole_is_what_made_three_downs_beat_an_invalid_answer(shaping):
    kept, _ = shaped_return(shaping.progress_no_bumps, [DOWN, DOWN, DOWN])
    lost, _ = shaped_return(shaping.progress_lost_in_holes, [DOWN, DOWN, DOWN])
    assert kept == pytest.approx(0.0) and lost == pytest.approx(-0.5)


def test_the_goal_earns_the_whole_progress_and_bumps_cost_a_cell_each(shaping):
    path = [RIGHT, RIGHT, DOWN, DOWN, DOWN, RIGHT]
    total, reached = shaped_return(shaping.progress_lost_in_holes, path)
    assert reached and total == pytest.approx(1.0)
    total, reached = shaped_return(shaping.progress_lost_in_holes, [UP, *path])
    assert reached and total == pytest.approx(1.0 - shaping.BUMP_PENALTY)
    # an episode cut short keeps its progress: two cells toward the goal, not in a hole
    total, reached = shaped_return(shaping.progress_lost_in_holes, [RIGHT, RIGHT])
    assert not reached and total == pytest.approx(2 / 6)
