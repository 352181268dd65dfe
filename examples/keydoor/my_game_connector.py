"""The key-door game as a polar connector: the one class you write to train on your own game.

polar runs this class in its own process (see ``polar_train_config.yaml``)::

    harness:
      type: custom
      connector_spec:
        module: my_game_connector
        class_name: MyGameConnector
        config: {level: 1, seed: 42}

What the connector does is translate: the game's ``step(code) -> (game_over, reward)`` and
``get_observation()`` become Gymnasium's ``(obs, reward, terminated, truncated, info)`` with a
``Dict`` observation. Level 1 gives ``visual`` (98 floats) + ``inventory`` (2 floats) = 100 inputs.

``observation: image`` sends the room as a uint8 (H, W, 4) picture instead of ``visual`` (one 0/255 plane per
wall, key, door, agent), which polar's built-in agent reads with its CNN encoder; ``observation: egocentric``
sends the same planes on a (2H-1, 2W-1) canvas centred on the agent (walls beyond the room), so "the key is two
cells to my left" looks the same wherever the agent stands.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from keydoor_game import DOOR, KEY, WALL, KeyDoorGame

# How each static cell looks in the "objects" plane of the visual observation.
OBJECT_VALUES = {WALL: -1.0, KEY: 0.5, DOOR: 1.0}
# The planes of the image observations, in order (the agent's is the fourth).
IMAGE_PLANES = (WALL, KEY, DOOR)
OBSERVATIONS = ("flat", "image", "egocentric")


class MyGameConnector:
    """Dict observation {"visual", "inventory"}, 4 actions (up, down, left, right)."""

    action_space = spaces.Discrete(4)

    def __init__(self, config: dict) -> None:
        # size, door_anywhere, rocks, split_wall: override one rule of the level (null or absent: the level's own)
        rules = {k: config.get(k) for k in ("size", "door_anywhere", "rocks", "split_wall")}
        self.game = KeyDoorGame(level=int(config.get("level", 1)), seed=config.get("seed"), **rules)
        self.max_steps = int(config.get("max_steps") or self.game.level.max_steps)
        self.pixels = bool(config.get("pixels", False))  # also send an RGB image (multimodal obs)
        self.observation = str(config.get("observation") or "flat")
        if self.observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {', '.join(OBSERVATIONS)}, got {self.observation!r}")
        h, w = self.game.shape
        # grid_size: pad the room with walls to grid_size x grid_size cells (a curriculum over levels of different
        # sizes keeps one observation shape); default: the level's own size
        self.grid_size = int(config.get("grid_size") or h)
        if self.grid_size < h:
            raise ValueError(f"grid_size {self.grid_size} is smaller than level {config.get('level', 1)}'s {h}x{w} grid")
        h = w = self.grid_size
        obs_spaces: dict[str, spaces.Space] = {
            # two h*w planes: static objects (wall -1, key 0.5, door 1) and where the agent is
            "visual": spaces.Box(-1.0, 1.0, shape=(2 * h * w,), dtype=np.float32),
            # keys held (0/1) and the fraction of the step budget left (lets values see the time limit)
            "inventory": spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32),
        }
        if self.observation != "flat":
            side = (h, w) if self.observation == "image" else (2 * h - 1, 2 * w - 1)
            obs_spaces["image"] = spaces.Box(0, 255, shape=(*side, len(IMAGE_PLANES) + 1), dtype=np.uint8)
            del obs_spaces["visual"]
        if self.pixels:
            obs_spaces["pixels"] = spaces.Box(0, 255, shape=(h * 16, w * 16, 3), dtype=np.uint8)
        self.observation_space = spaces.Dict(obs_spaces)
        self.t = 0

    def reset(self, seed: int | None = None) -> dict:
        self.game.new_game(seed)
        self.t = 0
        return self._observe()

    def step(self, action: int):
        game_over, reward = self.game.step(int(action))
        self.t += 1
        truncated = not game_over and self.t >= self.max_steps  # out of time: not a terminal state
        info = {"success": self.game.won} if (game_over or truncated) else {}
        return self._observe(), reward, game_over, truncated, info

    def close(self) -> None:
        self.game.close()

    def _observe(self) -> dict:
        raw = self.game.get_observation()
        pad = self.grid_size - raw["grid"].shape[0]
        grid = np.pad(raw["grid"], ((0, pad), (0, pad)), constant_values=WALL)  # grid_size: walls beyond the room
        obs = {"inventory": np.array([min(raw["inventory"][0], 1), 1.0 - self.t / self.max_steps], dtype=np.float32)}
        if self.observation == "flat":
            objects = np.zeros(grid.shape, dtype=np.float32)
            for code, value in OBJECT_VALUES.items():
                objects[grid == code] = value
            agent = np.zeros(grid.shape, dtype=np.float32)
            agent[self.game.agent] = 1.0
            obs["visual"] = np.concatenate([objects.ravel(), agent.ravel()])
        else:
            image = np.zeros((*grid.shape, len(IMAGE_PLANES) + 1), dtype=np.uint8)
            for plane, code in enumerate(IMAGE_PLANES):
                image[..., plane] = (grid == code) * 255
            image[(*self.game.agent, len(IMAGE_PLANES))] = 255
            if self.observation == "egocentric":  # the agent at the centre; walls beyond the room
                n = self.grid_size
                canvas = np.zeros((3 * n - 2, 3 * n - 2, image.shape[2]), dtype=np.uint8)
                canvas[..., 0] = 255
                canvas[n - 1:2 * n - 1, n - 1:2 * n - 1] = image
                r, c = self.game.agent
                image = canvas[r:r + 2 * n - 1, c:c + 2 * n - 1]  # room row r is canvas row n-1+r: agent at n-1
            obs["image"] = np.ascontiguousarray(image)
        if self.pixels:
            obs["pixels"] = self.game.render_rgb(cell_px=16)
        return obs
