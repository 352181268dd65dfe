"""How sparse a key-door variant of the hierarchy example is: the share of episodes a uniformly random policy
opens the door in, picks up the key in, and visits the gap in (examples/hierarchy/keydoor_options.py).

    python benchmarks/keydoor_random_play.py --episodes 2000 '{}' '{"key_apart": true}' '{"size": 9, "key_apart": true}'

Each argument is a JSON object of ``KeyDoorSubgoals`` kwargs (``max_steps`` 120 unless given). Episode i resets
with seed i and the actions come from ``numpy.random.default_rng(0)``, so a rerun prints the same rates. Used to
pick the task of docs/hierarchy.md's key-apart comparison (one where flat PPO is rarely paid by chance).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "examples" / "hierarchy")]
from keydoor_options import KeyDoorSubgoals  # noqa: E402


def random_play(kwargs: dict[str, object], episodes: int) -> dict[str, float]:
    """The random policy's door, key and gap rates over ``episodes`` episodes of ``KeyDoorSubgoals(**kwargs)``."""
    env = KeyDoorSubgoals(**{"observation": "coords", "key_reward": 0, "max_steps": 120, **kwargs})
    rng = np.random.default_rng(0)
    door = key = gap = 0
    for episode in range(episodes):
        env.reset(seed=episode)
        held = visited = False
        while True:
            _, _, terminated, truncated, info = env.step(int(rng.integers(4)))
            held |= info["subgoal_key"]
            visited |= info["subgoal_gap"]
            if terminated or truncated:
                door += bool(info["success"])
                key += held
                gap += visited
                break
    return {"door": door / episodes, "key": key / episodes, "gap": gap / episodes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", nargs="+", help="JSON objects of KeyDoorSubgoals kwargs")
    p.add_argument("--episodes", type=int, default=2000)
    args = p.parse_args()
    for v in args.variants:
        print(v, json.dumps(random_play(json.loads(v), args.episodes)))


if __name__ == "__main__":
    main()
