"""How sparse a MiniGrid task is: the share of episodes a uniformly random policy ends at the goal (return > 0).

    python benchmarks/minigrid_random_goal_rate.py MiniGrid-DoorKey-6x6-v0@150 MiniGrid-DoorKey-8x8-v0 --episodes 200

``ID@N`` sets the env's ``max_steps`` to N (the env's own limit without it). Episode i resets with seed i and the
actions come from ``numpy.random.default_rng(0)``, so a rerun prints the same rates. Used to pick the sparse task
of docs/exploration.md's RND comparison (a task plain PPO can also solve by chance is no test of a novelty bonus).
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import minigrid  # noqa: F401  (registers the MiniGrid ids)
import numpy as np


def goal_rate(env_id: str, max_steps: int | None, episodes: int) -> tuple[float, int]:
    """The random policy's goal rate on ``env_id`` over ``episodes`` episodes, and the step limit used."""
    env = gym.make(env_id, **({"max_steps": max_steps} if max_steps else {}))
    rng = np.random.default_rng(0)
    reached = 0
    for episode in range(episodes):
        env.reset(seed=episode)
        while True:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            if terminated or truncated:
                reached += reward > 0
                break
    limit = int(env.unwrapped.max_steps)
    env.close()
    return reached / episodes, limit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("envs", nargs="+", help="MiniGrid ids, optionally ID@MAX_STEPS")
    parser.add_argument("--episodes", type=int, default=200)
    args = parser.parse_args()
    print("| env (`max_steps`) | random-policy goal rate |\n|---|---:|")
    for spec in args.envs:
        env_id, _, steps = spec.partition("@")
        rate, limit = goal_rate(env_id, int(steps) if steps else None, args.episodes)
        print(f"| {env_id.removeprefix('MiniGrid-').removesuffix('-v0')} ({limit}) | {rate:.3f} (of {args.episodes}) |")


if __name__ == "__main__":
    main()
