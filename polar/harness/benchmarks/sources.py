"""``tasks:`` / ``eval_tasks:``: a JSONL path, or a generated source (env seeds, reasoning-gym, HumanEval,
an lm-eval task). The one place a run's task list is read from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar.harness.agent.tasks import load_tasks


def seed_tasks(spec: Any) -> list[dict[str, Any]]:
    """One task per env seed; the LLM env runner resets its env with ``seed``."""
    return [{"id": f"seed-{s}", "seed": s, "prompt": f"episode with env seed {s}"} for s in spec.seed_range()]


def load_run_tasks(spec: Any, config_dir: Path | None = None) -> list[dict[str, Any]]:
    """The tasks ``spec`` names: ``str`` → :func:`polar.harness.agent.tasks.load_tasks`, else its source."""
    if isinstance(spec, str):
        return load_tasks(spec, config_dir)
    if spec.source == "seeds":
        return seed_tasks(spec)
    if spec.source == "reasoning_gym":
        from polar.harness.benchmarks import reasoning_gym

        return reasoning_gym.tasks(spec)
    if spec.source == "humaneval":
        from polar.harness.benchmarks import humaneval

        return humaneval.tasks(spec)
    from polar.harness.benchmarks import lm_eval

    return lm_eval.tasks(spec, config_dir)
