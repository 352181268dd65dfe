"""The key-apart variant of the hierarchy example's env (examples/hierarchy/keydoor_options.py, docs/hierarchy.md):
``size`` enlarges key-door level 3, ``key_apart`` puts the key in the room the door does not open from, so an
episode needs key, gap and door in that order."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "examples" / "hierarchy"), str(ROOT / "examples" / "keydoor")]
from keydoor_game import DOOR, KEY, KeyDoorGame  # noqa: E402
from keydoor_options import KeyDoorSubgoals  # noqa: E402


def test_key_apart_puts_the_key_across_the_middle_wall_from_the_door():
    env = KeyDoorSubgoals(observation="coords", key_reward=0, size=9, max_steps=120, key_apart=True)
    mid = 11 // 2
    apart = 0
    for seed in range(60):
        obs, info = env.reset(seed=seed)
        grid = env.game.grid
        assert grid.shape == (11, 11) and (grid == KEY).sum() == 1 and (grid == DOOR).sum() == 1
        key, door = tuple(np.argwhere(grid == KEY)[0]), env.game.door
        assert key != tuple(env.game.agent) and not info["subgoal_key"]
        assert obs[2] * 11 == pytest.approx(key[0]) and obs[3] * 11 == pytest.approx(key[1])  # coords see the moved key
        if door[1] != mid:  # a door above or below the middle wall belongs to neither room
            assert (key[1] - mid) * (door[1] - mid) < 0, (seed, key, door)
            apart += 1
    assert apart >= 50
    a, b = (KeyDoorSubgoals(size=9, key_apart=True) for _ in range(2))  # seeded: the same seed, the same rooms
    a.reset(seed=7)
    b.reset(seed=7)
    np.testing.assert_array_equal(a.game.grid, b.game.grid)
    check_env(KeyDoorSubgoals(observation="coords", size=9, key_apart=True), skip_render_check=True)


def test_without_key_apart_the_key_lands_on_the_doors_side_too():
    env = KeyDoorSubgoals(size=9)
    mid = 11 // 2
    same = 0
    for seed in range(60):
        env.reset(seed=seed)
        key, door = tuple(np.argwhere(env.game.grid == KEY)[0]), env.game.door
        same += int(door[1] != mid and (key[1] - mid) * (door[1] - mid) > 0)
    assert same > 10


def test_bad_variant_settings_are_refused():
    with pytest.raises(ValueError, match="level 1 has one room"):
        KeyDoorSubgoals(level=1, key_apart=True)
    with pytest.raises(ValueError, match="at least 3, got 2"):
        KeyDoorGame(3, size=2)
