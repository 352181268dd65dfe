"""The reward designer's candidates as Ray tasks (``backend: ray``) on the two-node test cluster: a round's
candidates train at once in distinct Ray workers, each still one `polar run` with its candidate in bubblewrap,
and every score is the one the sequential local path gives."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from polar.harness.agent.sandbox import bwrap_unusable
from polar.inference.chat import chat_function
from polar.inference.scripted import ScriptedEngine
from polar.llm_roles.reward_design import RewardDesignConfig, design_reward

pytestmark = [pytest.mark.ray, pytest.mark.skipif(bool(bwrap_unusable()), reason="needs bubblewrap")]

HEAD = "def compute_reward(obs, action, next_obs, terminated, truncated):\n"
GOOD = f"```python\n{HEAD}    return 0.0 if terminated else 1.0\n```"
BAD = f"```python\n{HEAD}    return 500.0 if terminated else -1.0\n```"
CRASH = f"```python\n{HEAD}    raise RuntimeError('boom')\n```"


def design(tmp_path: Path, name: str, **kwargs: object) -> list:
    engine = ScriptedEngine.tiny([GOOD, BAD, CRASH])
    cfg = RewardDesignConfig(env_id="CartPole-v1", description="balance the pole", rounds=1, candidates_per_round=3,
                             total_env_steps=1024, score_episodes=10, **kwargs)  # type: ignore[arg-type]
    return asyncio.run(design_reward(cfg, chat_function(engine, max_tokens=256), tmp_path / name)).candidates


@pytest.mark.timeout(900)
def test_candidates_train_in_parallel_ray_tasks_with_the_sequential_scores(ray_cluster, tmp_path):
    sequential = design(tmp_path, "local", max_parallel=1)
    on_ray = design(tmp_path, "ray", max_parallel=3, backend="ray")
    # the same results: scores and episode counts from the same seeded runs, the crash failing the same way
    assert [(c.score, c.episodes) for c in on_ray] == [(c.score, c.episodes) for c in sequential]
    assert on_ray[0].score is not None and on_ray[1].score is not None
    assert on_ray[2].error is not None and "RuntimeError: boom" in on_ray[2].error
    assert on_ray[2].error == sequential[2].error
    # each ran in a Ray worker of its own, at the same time as the others
    workers = [c.worker for c in on_ray]
    assert all(w is not None and w["backend"] == "ray" for w in workers)
    assert len({w["pid"] for w in workers}) == 3
    assert max(w["started_at"] for w in workers) < min(w["ended_at"] for w in workers)  # all three overlapped
    assert all(c.worker is not None and c.worker["backend"] == "local" for c in sequential)
    # sequential ones never overlap
    spans = sorted((c.worker["started_at"], c.worker["ended_at"]) for c in sequential if c.worker)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
