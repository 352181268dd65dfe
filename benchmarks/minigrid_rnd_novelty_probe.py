"""Does a trained RND bonus single out progress on DoorKey? The normalised novelty a run's final RND module gives
random-walk states, against the same layouts edited to: the key taken, the door open, the agent past the door.

    python benchmarks/minigrid_rnd_novelty_probe.py runs/dk6_rnd_0 --layouts 60

For a run of examples/minigrid/doorkey6_sparse_rnd.yaml (MiniGrid DoorKey with the full-grid observation:
``FullyObsWrapper``, ``ImgObsWrapper``, ``FlattenObservation``). Layout i resets with seed 1000 + i and walks 60
random steps (left, right, forward; ``numpy.random.default_rng(0)``); the edits are made on the env's grid, so the
states need not be reachable by that walk. Prints a markdown table of the bonus divided by the run's running
intrinsic-return std (the reward the policy is paid), mean and median per group.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import gymnasium as gym
import minigrid  # noqa: F401  (registers the MiniGrid ids)
import numpy as np
import torch
import yaml
from minigrid.core.world_object import Door, Key
from minigrid.wrappers import FullyObsWrapper, ImgObsWrapper

from polar.algorithms.rnd import RND
from polar.config.intrinsic import RNDConfig
from polar.trainers.checkpoint import CheckpointManager


def _observe(env: gym.Env[Any, Any]) -> np.ndarray:
    """The wrapped observation of the env's current state (each wrapper's ``observation`` from the inside out)."""
    chain: list[gym.ObservationWrapper[Any, Any, Any]] = []
    inner: Any = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, gym.ObservationWrapper):
            chain.append(inner)
        inner = inner.env
    obs = env.unwrapped.gen_obs()  # type: ignore[attr-defined]
    for wrapper in reversed(chain):
        obs = wrapper.observation(obs)
    return np.asarray(obs)


def _find(grid: Any, kind: type) -> tuple[int, int]:
    return next((i, j) for i in range(grid.width) for j in range(grid.height) if isinstance(grid.get(i, j), kind))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--layouts", type=int, default=60)
    args = parser.parse_args()
    cfg = yaml.safe_load((args.run_dir / "config.resolved.yaml").read_text())
    harness = cfg["harness"]
    env: gym.Env[Any, Any] = gym.make(harness["id"].split(":", 1)[-1], **(harness.get("kwargs") or {}))
    env = gym.wrappers.FlattenObservation(ImgObsWrapper(FullyObsWrapper(env)))
    rnd = RND(env.observation_space, RNDConfig(**cfg["policy"]["kwargs"]["intrinsic"]))
    rnd.restore(CheckpointManager(args.run_dir / "checkpoints").load_latest()["learner"]["intrinsic"])
    std = float((rnd.return_norm.var + 1e-8).sqrt())
    rng = np.random.default_rng(0)
    groups: dict[str, list[np.ndarray]] = {"random walk": [], "key taken": [], "door open": [], "past the door": []}
    for layout in range(args.layouts):
        env.reset(seed=1000 + layout)
        for _ in range(60):
            groups["random walk"].append(np.asarray(env.step(int(rng.integers(0, 3)))[0]))
        u: Any = env.unwrapped
        key, door = _find(u.grid, Key), _find(u.grid, Door)
        u.carrying = u.grid.get(*key)
        u.grid.set(*key, None)
        groups["key taken"].append(_observe(env))
        u.grid.get(*door).is_locked, u.grid.get(*door).is_open = False, True
        groups["door open"].append(_observe(env))
        u.agent_pos = (door[0] + 1, door[1])
        groups["past the door"].append(_observe(env))
    print("| states | count | bonus (mean) | bonus (median) |\n|---|---:|---:|---:|")
    for name, items in groups.items():
        bonus = rnd.novelty(torch.as_tensor(np.stack(items))) / std
        print(f"| {name} | {len(items)} | {float(bonus.mean()):.4f} | {float(bonus.median()):.4f} |")


if __name__ == "__main__":
    main()
