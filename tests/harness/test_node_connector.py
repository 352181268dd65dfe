"""The protocol implemented in another language: the Node.js LineWalk connector, end to end."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from polar.config import load_config
from polar.harness import make_vector_env

from .conftest import KEYDOOR_DIR

LINE_WALK = KEYDOOR_DIR.parent / "node_connector" / "line_walk.yaml"
pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")


def test_node_connector_batched_steps_autoreset_and_seeds():
    cfg = load_config(LINE_WALK)
    envs = make_vector_env(cfg.harness, 4, config_dir=cfg.config_dir)
    try:
        assert str(envs.single_action_space) == "Discrete(2)"
        obs, _ = envs.reset(seed=5)
        again, _ = envs.reset(seed=5)
        np.testing.assert_array_equal(obs, again)  # seeded in JavaScript, same starts
        assert obs.dtype == np.float32 and obs.shape == (4, 2)
        ended = np.zeros(4, dtype=bool)
        for _ in range(7):  # walking right always reaches the goal within size - 1 = 7 steps
            obs, reward, term, trunc, info = envs.step(np.ones(4, dtype=np.int64))
            if term.any():
                assert np.all(info["final_obs"][term][0][0] == 1.0)  # at the goal
                assert info["final_info"]["success"][term].all()
                assert np.allclose(reward[term], 0.99)
                ended |= term
        assert ended.all() and not trunc.any()
        with pytest.raises(Exception, match="values must lie in"):
            envs.step(np.full(4, 3))
    finally:
        envs.close()


def test_node_connector_exception_comes_back_with_class_name():
    from polar.errors import ConnectorRemoteError

    cfg = load_config(LINE_WALK)
    # the JS env validates its action; bypass polar's own check to see the remote error path
    envs = make_vector_env(cfg.harness, 1, config_dir=cfg.config_dir)
    try:
        envs.reset()
        envs.procs[0].send({"op": "step", "actions": np.array([5])})
        with pytest.raises(ConnectorRemoteError, match=r"LineWalk.step raised RangeError: action must be 0 or 1, got 5"):
            envs.procs[0].receive()
    finally:
        envs.close()
