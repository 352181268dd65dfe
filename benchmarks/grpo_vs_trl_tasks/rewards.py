"""Reward functions of benchmarks/grpo_vs_trl.py: plain Python, importable by polar's venv and TRL's alike.
Each is ``reward(task, output) -> float`` in [0, 1]."""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(task: dict, output: str) -> float:
    """1 when the last number in the reply equals the task's ``answer`` (numerically), else 0; for answers that
    are no number, the reply's last non-empty line must equal it. The answer may sit anywhere in a sentence:
    what is scored is the number, not a format the model was told."""
    answer = str(task["answer"]).strip()
    if NUMBER.fullmatch(answer):
        found = NUMBER.findall(output.replace(",", ""))
        return float(bool(found) and float(found[-1]) == float(answer))
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return float(bool(lines) and lines[-1] == answer)
