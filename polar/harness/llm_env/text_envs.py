"""Text renderers for Gymnasium's toy-text envs: FrozenLake, Taxi, Blackjack, CliffWalking.

Their ANSI renders mark the agent with colour codes an LLM never sees, so each renderer writes a plain
description instead: a grid with the agent's cell marked, its coordinates, and what each move would
reach. A renderer also names the actions (in index order), states the goal and says what counts as
success. Renderers read the env's own state (``env.unwrapped``), never a copy of its rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TextRenderer:
    goal: str
    actions: tuple[str, ...]
    render: Callable[[Any, Any], str]  # (env.unwrapped, observation) -> text
    success: Callable[[bool, float, dict[str, Any]], bool]  # (terminated, last reward, info) -> success


def _grid_moves(rows: list[str], r: int, c: int, names: dict[str, tuple[int, int]], what: dict[str, str]) -> str:
    parts = []
    for name, (dr, dc) in names.items():
        rr, cc = r + dr, c + dc
        if not (0 <= rr < len(rows) and 0 <= cc < len(rows[0])):
            parts.append(f"{name}: wall (you stay)")
        else:
            parts.append(f"{name}: {what.get(rows[rr][cc], rows[rr][cc])}")
    return "; ".join(parts)


# ---- FrozenLake: 0 left, 1 down, 2 right, 3 up -------------------------------------------------------

_FL_MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_FL_CELLS = {"S": "frozen (start)", "F": "frozen", "H": "a hole (you fall in and lose)", "G": "the goal"}


def _frozenlake(env: Any, obs: Any) -> str:
    rows = ["".join(ch.decode() if isinstance(ch, bytes) else str(ch) for ch in row) for row in env.desc]
    ncol = len(rows[0])
    r, c = divmod(int(obs), ncol)
    grid = "\n".join(" ".join("P" if (i, j) == (r, c) else ch for j, ch in enumerate(row)) for i, row in enumerate(rows))
    goal = next((i, row.index("G")) for i, row in enumerate(rows) if "G" in row)
    return (f"Map (row 1 is the top; P = you, S = start, F = frozen, H = hole, G = goal):\n{grid}\n"
            f"You are at row {r + 1}, column {c + 1}. The goal is at row {goal[0] + 1}, column {goal[1] + 1}.\n"
            f"Moves: {_grid_moves(rows, r, c, _FL_MOVES, _FL_CELLS)}.")


FROZENLAKE = TextRenderer(
    goal="You walk on a frozen lake. Reach the goal G without falling into a hole H.",
    actions=("left", "down", "right", "up"),
    render=_frozenlake,
    success=lambda terminated, reward, info: terminated and reward > 0,
)


# ---- Taxi: 0 south, 1 north, 2 east, 3 west, 4 pickup, 5 dropoff -------------------------------------

_TAXI_NAMES = "RGYB"


def _taxi(env: Any, obs: Any) -> str:
    row, col, passenger, dest = env.decode(int(obs))
    desc = env.desc
    walls = []
    if row == 4:
        walls.append("south")
    if row == 0:
        walls.append("north")
    if desc[1 + row][2 * col + 2] == b"|":
        walls.append("east")
    if desc[1 + row][2 * col] == b"|":
        walls.append("west")
    stops = ", ".join(f"{_TAXI_NAMES[i]} at row {r + 1}, column {c + 1}" for i, (r, c) in enumerate(env.locs))
    where = "in the taxi" if passenger == 4 else f"waiting at {_TAXI_NAMES[passenger]}"
    return (f"The city is a 5x5 grid (row 1 is the top). Stops: {stops}.\n"
            f"The taxi is at row {row + 1}, column {col + 1}. The passenger is {where}; "
            f"the destination is {_TAXI_NAMES[dest]}.\n"
            f"Walls block: {', '.join(walls) or 'nothing'} from here.")


TAXI = TextRenderer(
    goal="You drive a taxi. Go to the passenger, pick them up, drive to the destination and drop them off.",
    actions=("south", "north", "east", "west", "pickup", "dropoff"),
    render=_taxi,
    success=lambda terminated, reward, info: terminated and reward > 0,
)


# ---- Blackjack: 0 stick, 1 hit ----------------------------------------------------------------------

def _blackjack(env: Any, obs: Any) -> str:
    player, dealer, usable_ace = (int(x) for x in obs)
    ace = " (one ace counts as 11)" if usable_ace else ""
    dealer_card = "an ace" if dealer == 1 else str(dealer)
    return f"Your hand totals {player}{ace}. The dealer shows {dealer_card}."


BLACKJACK = TextRenderer(
    goal="You play blackjack against the dealer. Get closer to 21 than the dealer without going over 21.",
    actions=("stick", "hit"),
    render=_blackjack,
    success=lambda terminated, reward, info: reward > 0,
)


# ---- CliffWalking: 0 up, 1 right, 2 down, 3 left ----------------------------------------------------

_CW_MOVES = {"up": (-1, 0), "right": (0, 1), "down": (1, 0), "left": (0, -1)}
_CW_CELLS = {"o": "safe ground", "S": "the start", "C": "the cliff (you fall and restart)", "T": "the goal"}


def _cliffwalking(env: Any, obs: Any) -> str:
    nrow, ncol = env.shape
    rows = [["o"] * ncol for _ in range(nrow)]
    for c in range(1, ncol - 1):
        rows[nrow - 1][c] = "C"
    rows[nrow - 1][0], rows[nrow - 1][ncol - 1] = "S", "T"
    text_rows = ["".join(r) for r in rows]
    r, c = divmod(int(obs), ncol)
    grid = "\n".join(" ".join("P" if (i, j) == (r, c) else ch for j, ch in enumerate(row))
                     for i, row in enumerate(text_rows))
    return (f"Map (row 1 is the top; P = you, o = safe, C = cliff, S = start, T = goal):\n{grid}\n"
            f"You are at row {r + 1}, column {c + 1}. The goal is at row {nrow}, column {ncol}.\n"
            f"Moves: {_grid_moves(text_rows, r, c, _CW_MOVES, _CW_CELLS)}.")


CLIFFWALKING = TextRenderer(
    goal="Walk from the start S to the goal T along the grid without stepping off the cliff C.",
    actions=("up", "right", "down", "left"),
    render=_cliffwalking,
    success=lambda terminated, reward, info: terminated,
)


RENDERERS: dict[str, TextRenderer] = {
    "FrozenLake": FROZENLAKE, "Taxi": TAXI, "Blackjack": BLACKJACK, "CliffWalking": CLIFFWALKING,
}


def renderer_for(env_id: str | None) -> TextRenderer | None:
    """The renderer of a Gymnasium id (any version: ``FrozenLake-v1``, ``FrozenLake8x8-v1``), or None."""
    if not env_id:
        return None
    name = env_id.split("/")[-1].split("-v")[0]
    for prefix, renderer in RENDERERS.items():
        if name.startswith(prefix):
            return renderer
    return None
