"""polar's verifier in benchmarks/grpo_vs_trl.py: the benchmark's reward function as it is, plus the exact-success
verdict (``reward >= 1``) that polar's held-out success reads."""

from __future__ import annotations

import importlib
from typing import Any


def verify(task: dict[str, Any], output: str, reward: str) -> dict[str, Any]:
    module, _, name = reward.partition(":")
    value = float(getattr(importlib.import_module(module), name)(task, output))
    return {"reward": value, "success": value >= 1.0}
