"""Dense reward shaping for examples/llm_frozenlake.yaml (``agent.reward.function``).

FrozenLake pays 1 at the goal and 0 everywhere else: a policy that reaches the goal less than once in a
group of 8 episodes gives GRPO no signal (uniformly random moves on the 4x4 map succeed 0.3% of the time
within 8 steps). This adds potential-based shaping (Ng, Harada and Russell, 1999: it keeps the optimal
policy) with the potential minus the Manhattan distance to the goal, scaled so that walking start to goal
earns 1 in all, plus a penalty for falling into a hole. Held-out *success* is still the env's own verdict.

Only moves are shaped: an answer that does not parse leaves the agent where it is and is charged
``agent.invalid_action_penalty`` alone. Keep that penalty above the expected hole risk: with it at 0, GRPO
learned to stall (invalid answers 63% -> 84% of steps, falls 43 -> 15 of 200, goal never reached;
docs/benchmarks.md, "GRPO on FrozenLake").
"""

from __future__ import annotations

from typing import Any

NCOL = 4  # the fixed 4x4 map (map_name: 4x4); the goal is the last cell
GOAL = (3, 3)
PATH_LENGTH = 6  # Manhattan distance start -> goal
HOLE_PENALTY = 0.5


def _distance(state: Any) -> int:
    row, col = divmod(int(state), NCOL)
    return abs(GOAL[0] - row) + abs(GOAL[1] - col)


def progress(obs: Any, action: Any, reward: float, next_obs: Any, terminated: bool, info: Any) -> float:
    """+1/6 per cell closer to the goal, -1/6 per cell further, and -0.5 when the episode ends in a hole."""
    shaped = (_distance(obs) - _distance(next_obs)) / PATH_LENGTH
    if terminated and reward <= 0:
        shaped -= HOLE_PENALTY
    return shaped


BUMP_PENALTY = 1 / PATH_LENGTH


def progress_no_bumps(obs: Any, action: Any, reward: float, next_obs: Any, terminated: bool, info: Any) -> float:
    """``progress`` plus -1/6 for a move into the wall (the agent stays where it is). With ``progress`` alone
    a policy that always answers "right" walks to the top-right corner, earns +0.5 and then bumps the wall
    for free; every episode of a group scores the same, so GRPO sees no signal and the policy stays there
    (the second FrozenLake run, in the history of docs/benchmarks.md)."""
    shaped = progress(obs, action, reward, next_obs, terminated, info)
    if int(next_obs) == int(obs) and not terminated:
        shaped -= BUMP_PENALTY
    return shaped


def progress_lost_in_holes(obs: Any, action: Any, reward: float, next_obs: Any, terminated: bool, info: Any) -> float:
    """``progress_no_bumps``, but a fall into a hole also takes back the progress made, so every episode that
    ends in a hole returns -0.5 (less its bumps), wherever the hole is. With the progress kept, three moves
    down into the hole at row 4 returned 0, above an unparsable first answer (-0.5): the episode advantage
    credited the fatal move, and two runs collapsed onto it (docs/benchmarks.md, "GRPO on FrozenLake")."""
    shaped = progress_no_bumps(obs, action, reward, next_obs, terminated, info)
    if terminated and reward <= 0:
        shaped -= (PATH_LENGTH - _distance(next_obs)) / PATH_LENGTH
    return shaped
