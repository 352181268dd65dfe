"""A bigger suite (slow): CartPole under every robustness wrapper, 30 held-out seeds, Student-t intervals,
with the numbers of each row checked against the same plain loop the default test uses."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
import yaml

from polar.evaluation.runner import run_suite
from polar.evaluation.stats import summarize
from polar.evaluation.suite import load_suite
from polar.evaluation.wrappers import apply_wrappers
from tests.evaluation.helpers import EXAMPLES, make_env_run
from tests.evaluation.test_suite import _batched, _direct_env

WRAPPERS = {
    "noise": [{"type": "observation_noise", "std": 0.2}],
    "delay": [{"type": "action_delay", "steps": 2}],
    "repeat": [{"type": "action_repeat", "times": 3}],
    "sticky": [{"type": "sticky_actions", "prob": 0.25}],
    "all": [{"type": "observation_noise", "std": 0.1}, {"type": "sticky_actions", "prob": 0.1},
            {"type": "action_delay", "steps": 1}],
}
SEEDS = list(range(5_000_000, 5_000_030))


@pytest.mark.slow
def test_every_wrapper_over_thirty_seeds_matches_a_direct_loop(tmp_path):
    from polar.trainers.loading import load_policy_for_eval

    run = make_env_run(tmp_path / "cart", EXAMPLES / "cartpole_ppo.yaml", seeds=(7, 8))
    data = {"name": "big", "parallel": {"workers": 2}, "interval": {"method": "t", "level": 0.95},
            "policies": [{"name": "one", "checkpoint": str(run / "checkpoints" / "ckpt_00000001.pt")},
                         {"name": "two", "run": str(run)}],
            "harnesses": [{"name": k, "harness": {"type": "gymnasium", "id": "CartPole-v1"}, "wrappers": w,
                           "seeds": {"start": SEEDS[0], "count": len(SEEDS)}, "num_envs": 5}
                          for k, w in WRAPPERS.items()]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    suite = load_suite(tmp_path / "s.yaml")
    report = run_suite(suite, tmp_path / "out")
    assert [r["error"] for r in report["results"]] == [None] * 10
    for policy, ckpt in (("one", "ckpt_00000001.pt"), ("two", "ckpt_00000002.pt")):
        p = load_policy_for_eval(run / "checkpoints" / ckpt)[2]
        for h in suite.harnesses:
            env = apply_wrappers(gym.make("CartPole-v1"), h.wrappers)
            with torch.inference_mode():
                direct = _direct_env(env, lambda obs, p=p: int(p.act(_batched(obs), None, True)[0][0]), SEEDS)
            row = next(r for r in report["results"] if r["harness"] == h.name and r["policy"] == policy)
            assert [e["return"] for e in row["episodes"]] == [r for r, _, _ in direct], h.name
            assert row["metrics"]["return"] == summarize([r for r, _, _ in direct], "t", 0.95)
