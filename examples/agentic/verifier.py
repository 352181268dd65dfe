"""Reward for the calculator task: 1 when the agent's last output line is exactly the right integer."""

from __future__ import annotations


def verify(task: dict, output: str) -> dict:
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    got = lines[-1] if lines else ""
    return {"reward": float(got == str(task["answer"])), "got": got, "expected": task["answer"]}
