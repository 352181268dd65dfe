"""A connector SIGKILLed mid-episode, one that hangs, one that keeps dying: recovery and accounting."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from polar.errors import ConnectorCrashed
from polar.harness.connector.vector_env import RESTART_KEY, ConnectorVectorEnv

from .conftest import CONNECTORS_DIR, make_spec

N = 3
LENGTH = 5


def run_and_account(envs, steps, on_step=None):
    """Step ``steps`` times; return (completed episode ids, restart-truncated count, per-env episode lengths)."""
    completed, restarted, lengths = [], 0, [[] for _ in range(N)]
    current = np.zeros(N, dtype=int)
    for k in range(steps):
        if on_step:
            on_step(k)
        _, reward, term, trunc, info = envs.step(np.zeros(N, dtype=np.int64))
        current += 1
        for i in np.flatnonzero(term | trunc):
            final = {key: v[i] for key, v in info["final_info"].items() if not key.startswith("_") and info["final_info"][f"_{key}"][i]}
            if final.get(RESTART_KEY):
                assert trunc[i] and not term[i] and reward[i] == 0.0
                assert info[RESTART_KEY][i] and info["_" + RESTART_KEY][i]
                restarted += 1
            else:
                assert term[i] and current[i] == LENGTH  # a completed episode is whole
                completed.append(final["episode_id"])
                np.testing.assert_array_equal(info["final_obs"][i], [LENGTH, float(final["episode_id"].split("-")[-1]) + 1])
            lengths[i].append(int(current[i]))
            current[i] = 0
    return completed, restarted, lengths


def logged(path):
    return path.read_text().split() if path.exists() else []


def test_sigkill_mid_episode_is_recovered_without_losing_completed_episodes(tmp_path):
    log = tmp_path / "episodes.log"
    envs = ConnectorVectorEnv(make_spec("CountingConnector", config={"length": LENGTH, "log": str(log)}), N, config_dir=CONNECTORS_DIR)
    try:
        envs.reset(seed=[0, 1, 2])
        first_pid = envs.pids[0]

        def kill_at_12(k):
            if k == 12:  # 12 steps in: every copy is 2 steps into its third episode
                os.kill(envs.pids[0], signal.SIGKILL)

        completed, restarted, lengths = run_and_account(envs, 30, kill_at_12)
        assert envs.restarts == 1 and envs.pids[0] != first_pid
        assert restarted == N  # each interrupted episode reported once, as truncated
        assert sorted(completed) == sorted(logged(log))  # every episode the env finished reached us
        assert len(completed) == N * (2 + 3)  # 2 before the kill, 3 whole ones after it
        for per_env in lengths:
            assert per_env == [5, 5, 3, 5, 5, 5]  # the killed step ends the 3rd episode early
    finally:
        envs.close()


def test_hung_connector_is_killed_and_restarted(tmp_path):
    log = tmp_path / "episodes.log"
    config = {"length": LENGTH, "log": str(log), "hang_once_at": 8, "hang_flag": str(tmp_path / "hung")}
    spec = make_spec("CountingConnector", config=config, call_timeout_s=3.0)
    envs = ConnectorVectorEnv(spec, N, config_dir=CONNECTORS_DIR)
    try:
        envs.reset(seed=[0, 1, 2])
        completed, restarted, lengths = run_and_account(envs, 20)
        assert (tmp_path / "hung").exists()
        assert envs.restarts == 1 and restarted == N
        assert sorted(completed) == sorted(logged(log))
        assert all(per_env[:2] == [5, 3] for per_env in lengths)  # hung on step 8 = 3rd step of episode 2
    finally:
        envs.close()


def test_connector_that_keeps_dying_raises_with_its_stderr(tmp_path):
    spec = make_spec("CountingConnector", config={"exit_at": 2}, max_restarts=2)
    envs = ConnectorVectorEnv(spec, 1, config_dir=CONNECTORS_DIR)
    try:
        envs.reset()
        envs.step(np.array([0]))
        _, _, _, trunc, info = envs.step(np.array([0]))  # dies: restart 1, episode truncated
        assert trunc[0] and info[RESTART_KEY][0]
        envs.step(np.array([0]))
        _, _, _, trunc, _ = envs.step(np.array([0]))  # dies again: restart 2
        assert trunc[0] and envs.restarts == 2
        envs.step(np.array([0]))
        with pytest.raises(ConnectorCrashed) as e:
            envs.step(np.array([0]))  # third failure in a row > max_restarts=2
        msg = str(e.value)
        assert "CountingConnector" in msg and "max_restarts=2" in msg and "exit code 3" in msg
        assert "fatal: reactor core breach" in msg
    finally:
        envs.close()


def test_heartbeat_notices_a_dead_idle_connector(tmp_path):
    spec = make_spec("CountingConnector", config={"length": LENGTH}, heartbeat_interval_s=0.1)
    envs = ConnectorVectorEnv(spec, 1, config_dir=CONNECTORS_DIR)
    try:
        envs.reset()
        envs.step(np.array([0]))
        os.kill(envs.pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while envs.procs[0].dead_reason is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "heartbeat failed" in (envs.procs[0].dead_reason or "")
        _, _, _, trunc, info = envs.step(np.array([0]))
        assert trunc[0] and info[RESTART_KEY][0] and envs.restarts == 1
        _, reward, *_ = envs.step(np.array([0]))
        assert reward[0] == 1.0
    finally:
        envs.close()
