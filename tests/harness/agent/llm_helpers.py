"""Scripted 'models' for the LLM env agent tests: they read the prompt the agent built and answer."""

from __future__ import annotations

import re
from collections import deque

MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


def frozenlake_move(text: str) -> str:
    """The first move of a shortest hole-free path to G on the last map in ``text`` (BFS)."""
    grid_block = text.rsplit("Map (", 1)[1].split("\n", 1)[1].split("\nYou are at", 1)[0]
    rows = [row.split() for row in grid_block.strip().splitlines()]
    start = next((i, row.index("P")) for i, row in enumerate(rows) if "P" in row)
    seen, queue = {start}, deque([(start, None)])
    while queue:
        (r, c), first = queue.popleft()
        if rows[r][c] == "G":
            return first
        for name, (dr, dc) in MOVES.items():
            rr, cc = r + dr, c + dc
            if 0 <= rr < len(rows) and 0 <= cc < len(rows[0]) and (rr, cc) not in seen and rows[rr][cc] != "H":
                seen.add((rr, cc))
                queue.append(((rr, cc), first or name))
    return "left"


def scripted(tokenizer, answer):
    """A ScriptedEngine responder: ``answer(prompt_text, index)`` gives the reply text."""

    def respond(request, index):
        return answer(tokenizer.decode(request.prompt_ids), index)

    return respond


def last_user_turn(text: str) -> str:
    return re.split(r"<\|im_start\|>(?:user|tool)\n", text)[-1]


def bonus_on_goal(obs, action, reward, next_obs, terminated, info):
    """A shaping function for the tests: +0.5 on the step that reaches the goal."""
    return 0.5 if terminated and reward > 0 else 0.0
