"""The key-door game (its own API), its connector, and that PPO can learn level 1."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from polar.harness.checker import check_env

from .conftest import KEYDOOR_DIR, make_spec

sys.path.insert(0, str(KEYDOOR_DIR))
from keydoor_game import DOOR, DOWN, KEY, LEFT, LEVELS, RIGHT, UP, WALL, KeyDoorGame


def walk_to(game: KeyDoorGame, target: tuple[int, int]) -> tuple[bool, float]:
    """Greedy walk (level 1 has no obstacles inside the room)."""
    total, over = 0.0, False
    while game.agent != target and not over:
        dr, dc = target[0] - game.agent[0], target[1] - game.agent[1]
        action = (DOWN if dr > 0 else UP) if dr else (RIGHT if dc > 0 else LEFT)
        over, reward = game.step(action)
        total += reward
    return over, total


def test_game_rules_key_then_door():
    game = KeyDoorGame(level=1, seed=3)
    obs = game.get_observation()
    assert obs["grid"].shape == (7, 7) and obs["inventory"] == [0]
    key = tuple(np.argwhere(obs["grid"] == KEY)[0])
    door = game.door
    below_door = (door[0] + 1, door[1])
    if game.agent != below_door:
        walk_to(game, below_door if key != below_door else (below_door[0] + 1, below_door[1]))
    over, reward = game.step(UP)  # the door is locked without the key
    assert not over and reward == pytest.approx(-0.01) and game.agent != door
    over, total = walk_to(game, key)
    assert game.get_observation()["inventory"] == [1] and not over and total > 0.1  # +0.2 for the key
    walk_to(game, below_door)
    over, reward = game.step(UP)
    assert over and game.won and reward == pytest.approx(1.0 - 0.01)
    with pytest.raises(RuntimeError, match="game is over"):
        game.step(UP)


def test_levels_are_seeded_and_walled():
    for level in LEVELS:
        a, b = KeyDoorGame(level, seed=11), KeyDoorGame(level, seed=11)
        np.testing.assert_array_equal(a.get_observation()["grid"], b.get_observation()["grid"])
        grid = a.get_observation()["grid"]
        assert (grid == DOOR).sum() == 1 and (grid == KEY).sum() == 1
        assert np.all(np.isin(grid[0], [WALL, DOOR])) and np.all(np.isin(grid[:, -1], [WALL, DOOR]))
    with pytest.raises(ValueError, match="unknown level 9"):
        KeyDoorGame(9)
    with pytest.raises(ValueError, match="action_code must be one of"):
        KeyDoorGame(1, seed=0).step(7)


def test_render_rgb_without_a_window():
    img = KeyDoorGame(1, seed=0).render_rgb(cell_px=8)
    assert img.shape == (56, 56, 3) and img.dtype == np.uint8 and len(np.unique(img.reshape(-1, 3), axis=0)) >= 4


def test_connector_with_pixels_and_png_compression_passes_the_checker():
    from polar.harness.connector.vector_env import ConnectorEnv

    spec = make_spec("MyGameConnector", module="my_game_connector", config={"level": 2, "seed": 0, "pixels": True},
                     compression="png")
    env = ConnectorEnv(spec, config_dir=KEYDOOR_DIR)
    assert env.observation_space["pixels"].shape == (112, 112, 3)
    report = check_env(env, steps=80)
    assert report.ok, [str(v) for v in report.violations]


@pytest.mark.slow
def test_ppo_learns_level_1():
    """Stable-Baselines3 PPO (an independent learner) solves level 1 from the connector's observations."""
    sb3 = pytest.importorskip("stable_baselines3")
    import gymnasium as gym
    import torch
    from my_game_connector import MyGameConnector

    torch.set_num_threads(1)

    class InProcess(gym.Env):
        def __init__(self):
            self.c = MyGameConnector({"level": 1, "seed": 0})
            self.observation_space, self.action_space = self.c.observation_space, self.c.action_space

        def reset(self, seed=None, options=None):
            return self.c.reset(seed), {}

        def step(self, action):
            return self.c.step(action)

    venv = sb3.common.env_util.make_vec_env(InProcess, n_envs=8, seed=0)
    model = sb3.PPO("MultiInputPolicy", venv, n_steps=128, batch_size=256, ent_coef=0.01, seed=0,
                    policy_kwargs={"net_arch": [128, 64]})
    model.learn(120_000)
    env, wins = InProcess(), 0
    for ep in range(100):
        obs, _ = env.reset(seed=10_000 + ep)
        while True:
            obs, _, term, trunc, info = env.step(int(model.predict(obs, deterministic=True)[0]))
            if term or trunc:
                wins += info["success"]
                break
    assert wins >= 90


def test_grid_size_pads_every_level_to_one_observation_shape():
    """The curriculum example's ``grid_size: 9``: levels 1 (7x7 grid) and 3 (9x9) share one observation space; the
    padding reads as wall, and the room itself is unchanged."""
    from my_game_connector import MyGameConnector

    small = MyGameConnector({"level": 1, "seed": 3})
    padded = MyGameConnector({"level": 1, "seed": 3, "grid_size": 9})
    big = MyGameConnector({"level": 3, "seed": 3, "grid_size": 9})
    assert padded.observation_space == big.observation_space != small.observation_space
    a, b = small.reset(seed=3), padded.reset(seed=3)
    objects_small, objects_padded = a["visual"][:49].reshape(7, 7), b["visual"][:81].reshape(9, 9)
    assert np.array_equal(objects_padded[:7, :7], objects_small)
    assert (objects_padded[7:, :] == -1.0).all() and (objects_padded[:, 7:] == -1.0).all()
    assert np.array_equal(b["visual"][81:].reshape(9, 9)[:7, :7], a["visual"][49:].reshape(7, 7))
    with pytest.raises(ValueError, match="grid_size 5 is smaller than level 1's 7x7 grid"):
        MyGameConnector({"level": 1, "grid_size": 5})


def _winnable(grid: np.ndarray, agent: tuple[int, int], door: tuple[int, int]) -> bool:
    """The test's own breadth-first search: the key and a cell next to the door are reachable from the agent."""
    seen, frontier = {agent}, [agent]
    while frontier:
        r, c = frontier.pop()
        for t in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if t not in seen and grid[t] in (0, KEY):  # walls, rocks and the shut door block
                seen.add(t)
                frontier.append(t)
    (key,) = [tuple(rc) for rc in np.argwhere(grid == KEY)]
    near_door = {(door[0] + dr, door[1] + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))}
    return key in seen and bool(near_door & seen)


@pytest.mark.parametrize("rules", [{"level": 1}, {"level": 2}, {"level": 3}, {"level": 2, "rocks": 6},
                                   {"level": 3, "size": 5}, {"level": 3, "rocks": 4}])
def test_every_generated_room_is_winnable(rules):
    """Rocks (level 2) can wall off the key, the agent or the door's one open side, and level 3's split wall can
    stand behind a door in the top or bottom wall; 12.9% of level-2 and 6.1% of level-3 rooms were unwinnable
    before the game drew such layouts again. 3000 rooms per variant, each checked by a breadth-first search."""
    game = KeyDoorGame(seed=0, **rules)
    for _ in range(3000):
        game.new_game()
        grid = game.grid
        assert grid[game.door] == DOOR and (grid == KEY).sum() == 1 and grid[game.agent] == 0
        assert _winnable(grid, tuple(game.agent), tuple(game.door)), (rules, grid)


def test_rule_overrides_give_the_steps_between_levels():
    """``rocks``, ``door_anywhere``, ``split_wall`` and ``size`` each change one rule of a level and nothing else."""
    def interior_walls(g: KeyDoorGame) -> int:
        return int((g.grid[1:-1, 1:-1] == WALL).sum())

    doors = set()
    for seed in range(200):
        no_rocks = KeyDoorGame(2, seed=seed, rocks=0)
        assert interior_walls(no_rocks) == 0 and no_rocks.level.max_steps == LEVELS[2].max_steps
        doors.add(no_rocks.door)
        assert interior_walls(KeyDoorGame(2, seed=seed)) == 3
        assert interior_walls(KeyDoorGame(3, seed=seed, split_wall=False)) == 0
        assert interior_walls(KeyDoorGame(3, seed=seed)) == 6  # a 7-cell wall with one gap
        assert KeyDoorGame(1, seed=seed, door_anywhere=False).door == (0, 3)
    assert len(doors) == 20  # every cell of a 5x5 room's wall, corners excepted
    assert {KeyDoorGame(1, seed=s, door_anywhere=True).door for s in range(200)} == doors
    with pytest.raises(ValueError, match=r"rocks must be in 0\.\.12 for a 5x5 room, got 13"):
        KeyDoorGame(2, rocks=13)


@pytest.mark.parametrize("observation", ["image", "egocentric"])
def test_image_observations_read_by_the_cnn_pass_the_checker(observation):
    """``observation: image | egocentric``: one uint8 0/255 plane per wall, key, door and agent, which polar's
    built-in agent encodes with its CNN; egocentric puts the agent at the centre with walls beyond the room."""
    from my_game_connector import MyGameConnector

    from polar.config.agent import BuiltinAgentConfig
    from polar.harness.connector.vector_env import ConnectorEnv
    from polar.models.actor_critic import ActorCriticAgent
    from polar.models.encoders import CNNEncoder

    conn = MyGameConnector({"level": 3, "seed": 5, "grid_size": 9, "observation": observation})
    n = 9 if observation == "image" else 17
    assert conn.observation_space["image"].shape == (n, n, 4) and "visual" not in conn.observation_space.spaces
    for seed in range(50):
        img = conn.reset(seed=seed)["image"]
        room = conn.game.get_observation()["grid"]
        r, c = conn.game.agent
        dr, dc = (0, 0) if observation == "image" else (8 - r, 8 - c)
        assert img[r + dr, c + dc, 3] == 255 and img[..., 3].sum() == 255
        for plane, code in enumerate((WALL, KEY, DOOR)):
            assert np.array_equal(img[dr:dr + 9, dc:dc + 9, plane] == 255, room == code)
        if observation == "egocentric":  # outside the room reads as wall
            outside = np.ones((17, 17), bool)
            outside[dr:dr + 9, dc:dc + 9] = False
            assert (img[outside, 0] == 255).all()
    agent = ActorCriticAgent(conn.observation_space, conn.action_space, BuiltinAgentConfig(type="cnn"))
    assert any(isinstance(m, CNNEncoder) for m in agent.modules())
    spec = make_spec("MyGameConnector", module="my_game_connector",
                     config={"level": 3, "seed": 0, "grid_size": 9, "observation": observation})
    report = check_env(ConnectorEnv(spec, config_dir=KEYDOOR_DIR), steps=150)
    assert report.ok, [str(v) for v in report.violations]
    with pytest.raises(ValueError, match="observation must be one of flat, image, egocentric, got 'rgb'"):
        MyGameConnector({"observation": "rgb"})
