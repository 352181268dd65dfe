"""MBPO learns Pendulum-v1 from few env steps (examples/mbpo/pendulum_mbpo.yaml, seed 0).

SAC with the same 64-64 networks needs 7k env steps for -400 (tests/learning/test_off_policy_learning.py) and
about 6k with 256-256 for -200 (docs/benchmarks.md); MBPO's model data must get there in fewer. The fast path
of the same code (fit, rollouts, mixed batches, checkpoint and resume through the loop) is in
tests/algorithms/test_mbpo.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.config import load_config
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUIET = ["logging.tensorboard=false", "logging.checkpoint_freq=0", "policy.kwargs.save_replay_buffer=false",
         "eval.every_n_iterations=0"]


@pytest.mark.slow
def test_mbpo_learns_pendulum_in_4k_env_steps(tmp_path):
    cfg = load_config(EXAMPLES / "mbpo" / "pendulum_mbpo.yaml", [*QUIET, "seed=0", "total_env_steps=4000"])
    res = compose(cfg, RunDir.create(cfg.name, tmp_path / "run")).train()
    assert res["eval"]["return_mean"] >= -250, res["eval"]
