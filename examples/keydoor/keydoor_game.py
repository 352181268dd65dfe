"""Key-door: a small grid game with its own, non-Gymnasium API (the "custom harness" of the seed doc).

The agent walks a walled room, picks up the key by walking onto it, then opens the door by walking
into it. The game knows nothing about RL libraries::

    game = KeyDoorGame(level=1, seed=42)
    game_over, reward = game.step(RIGHT)
    game.get_observation()   # {"grid": int8 (H, W) cell codes, "inventory": [keys held]}
    game.render_rgb()        # uint8 (H*px, W*px, 3) via pygame, no window needed

Levels: 1 = 5x5 room, door fixed in the top wall; 2 = 5x5 room, door anywhere on the wall, a few
rocks; 3 = 7x7 room split by a wall with one gap. Key and agent start at random cells (seeded). ``size``
keeps a level's rules on another room side (level 3 with ``size=13``: two 6x13 rooms and one gap);
``door_anywhere``, ``rocks`` and ``split_wall`` override one rule of a level (the steps between levels a
curriculum can schedule, e.g. level 2 with ``rocks=0``). Every room laid out is winnable: a layout where
rocks or the split wall cut the agent off from the key or the door is drawn again (``is_winnable``).
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

EMPTY, WALL, KEY, DOOR, AGENT = 0, 1, 2, 3, 4
UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3
MOVES = {UP: (-1, 0), DOWN: (1, 0), LEFT: (0, -1), RIGHT: (0, 1)}

STEP_REWARD = -0.01  # a small time cost: shorter solutions score higher
KEY_REWARD = 0.2  # first pick-up only
DOOR_REWARD = 1.0  # the goal


@dataclass(frozen=True)
class Level:
    size: int  # interior is size x size; the grid adds a one-cell wall border
    door_anywhere: bool
    rocks: int
    split_wall: bool
    max_steps: int  # a suggested step limit; enforcing it is the caller's business


LEVELS = {
    1: Level(size=5, door_anywhere=False, rocks=0, split_wall=False, max_steps=50),
    2: Level(size=5, door_anywhere=True, rocks=3, split_wall=False, max_steps=60),
    3: Level(size=7, door_anywhere=True, rocks=0, split_wall=True, max_steps=120),
}


class KeyDoorGame:
    """The game state and rules. ``step`` returns ``(game_over, reward)``; the game ends when the door opens."""

    def __init__(self, level: int = 1, seed: int | None = None, *, size: int | None = None,
                 door_anywhere: bool | None = None, rocks: int | None = None, split_wall: bool | None = None) -> None:
        if level not in LEVELS:
            raise ValueError(f"unknown level {level}; levels are {sorted(LEVELS)}")
        if size is not None and size < 3:
            raise ValueError(f"size is the room's interior side and must be at least 3, got {size}")
        # size: the same level on a larger (or smaller) room, e.g. level 3 with size 13 is two 6x13 rooms; the
        # other three override one rule of the level (None: the level's own)
        rules = {"size": size, "door_anywhere": door_anywhere, "rocks": rocks, "split_wall": split_wall}
        self.level = replace(LEVELS[level], **{k: v for k, v in rules.items() if v is not None})
        if not 0 <= self.level.rocks <= self.level.size**2 // 2:
            raise ValueError(f"rocks must be in 0..{self.level.size**2 // 2} for a {self.level.size}x"
                             f"{self.level.size} room, got {self.level.rocks}")
        self.rng = np.random.default_rng(seed)
        self.new_game()

    @property
    def shape(self) -> tuple[int, int]:
        return (self.level.size + 2, self.level.size + 2)

    def new_game(self, seed: int | None = None) -> None:
        """Lay out a fresh, winnable room. A seed restarts the random stream (same seed, same rooms)."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        for _ in range(10_000):
            self._lay_out()
            if is_winnable(self.grid, self.agent, self.door):
                return
        raise RuntimeError(f"no winnable room in 10000 draws for {self.level}; use fewer rocks")

    def _lay_out(self) -> None:
        n = self.level.size + 2
        grid = np.full((n, n), EMPTY, dtype=np.int8)
        grid[0, :] = grid[-1, :] = grid[:, 0] = grid[:, -1] = WALL
        if self.level.split_wall:
            col = n // 2
            grid[1:-1, col] = WALL
            grid[self.rng.integers(1, n - 1), col] = EMPTY  # the gap
        if self.level.door_anywhere:
            border = [(0, c) for c in range(1, n - 1)] + [(n - 1, c) for c in range(1, n - 1)]
            border += [(r, 0) for r in range(1, n - 1)] + [(r, n - 1) for r in range(1, n - 1)]
            self.door = border[self.rng.integers(len(border))]
        else:
            self.door = (0, n // 2)
        grid[self.door] = DOOR
        free = [tuple(rc) for rc in np.argwhere(grid == EMPTY)]
        picks = self.rng.choice(len(free), size=2 + self.level.rocks, replace=False)
        self.agent, key = free[picks[0]], free[picks[1]]
        grid[key] = KEY
        for p in picks[2:]:
            grid[free[p]] = WALL
        self.grid = grid
        self.keys_held = 0
        self.steps = 0
        self.won = False

    def step(self, action_code: int) -> tuple[bool, float]:
        """Move one cell. Walls (and a locked door) block; stepping on the key picks it up."""
        if self.won:
            raise RuntimeError("the game is over; call new_game() first")
        if action_code not in MOVES:
            raise ValueError(f"action_code must be one of {sorted(MOVES)} (up, down, left, right), got {action_code!r}")
        self.steps += 1
        reward = STEP_REWARD
        dr, dc = MOVES[action_code]
        target = (self.agent[0] + dr, self.agent[1] + dc)
        cell = self.grid[target]
        if cell == WALL or (cell == DOOR and self.keys_held == 0):
            return False, reward
        if cell == KEY:
            self.keys_held += 1
            self.grid[target] = EMPTY
            reward += KEY_REWARD
        self.agent = target
        if cell == DOOR:
            self.won = True
            return True, reward + DOOR_REWARD
        return False, reward

    def get_observation(self) -> dict:
        grid = self.grid.copy()
        grid[self.agent] = AGENT
        return {"grid": grid, "inventory": [self.keys_held]}

    def render_rgb(self, cell_px: int = 16) -> np.ndarray:
        """An RGB picture of the room, drawn with pygame on an off-screen surface."""
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        import pygame

        colors = {EMPTY: (30, 30, 40), WALL: (110, 110, 120), KEY: (240, 200, 40), DOOR: (150, 80, 30), AGENT: (60, 160, 250)}
        h, w = self.shape
        surface = pygame.Surface((w * cell_px, h * cell_px))
        for (r, c), code in np.ndenumerate(self.get_observation()["grid"]):
            rect = pygame.Rect(c * cell_px, r * cell_px, cell_px, cell_px)
            pygame.draw.rect(surface, colors[int(code)], rect)
            if code == DOOR and self.won:
                pygame.draw.rect(surface, (40, 200, 80), rect.inflate(-cell_px // 2, -cell_px // 2))
        return pygame.surfarray.array3d(surface).transpose(1, 0, 2).copy()

    def close(self) -> None:
        """Nothing to release: the game holds no window or file."""


def reachable(grid: np.ndarray, start: tuple[int, int], passable: tuple[int, ...]) -> set[tuple[int, int]]:
    """The cells a walk from ``start`` reaches through cells whose code is in ``passable`` (breadth-first)."""
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            t = (r + dr, c + dc)
            if 0 <= t[0] < grid.shape[0] and 0 <= t[1] < grid.shape[1] and t not in seen and grid[t] in passable:
                seen.add(t)
                queue.append(t)
    return seen


def is_winnable(grid: np.ndarray, agent: tuple[int, int], door: tuple[int, int]) -> bool:
    """Whether the agent can walk to the key and then into the door (the door is shut until the key is held)."""
    cells = reachable(grid, agent, (EMPTY, KEY))
    keys = [tuple(int(i) for i in rc) for rc in np.argwhere(grid == KEY)]
    return bool(keys) and all(k in cells for k in keys) and any(
        (door[0] + dr, door[1] + dc) in cells for dr, dc in MOVES.values())
