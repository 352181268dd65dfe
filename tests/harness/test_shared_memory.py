"""Shared-memory steps (docs/connector-protocol.md, section 4.7): the same results as the socket path, steps
that never cross the socket, and a peer that dies or hangs found exactly as before."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import numpy as np
import pytest

from polar.errors import ConnectorTimeout
from polar.harness.connector import shm
from polar.harness.connector.shm import SharedSteps
from polar.harness.connector.vector_env import RESTART_KEY, ConnectorVectorEnv
from polar.harness.connector.wire import ConnectionClosed, FrameSocket

from .conftest import CONNECTORS_DIR, make_spec

GYM = "polar.harness.connector.gym_connector"
pytestmark = pytest.mark.skipif(not shm.supported(), reason="shared-memory steps are offered on x86-64 only")


def cartpole(shared_memory: bool, n: int = 4) -> ConnectorVectorEnv:
    spec = make_spec("GymnasiumConnector", module=GYM, config={"id": "CartPole-v1"}, shared_memory=shared_memory)
    return ConnectorVectorEnv(spec, n)


def shm_folders() -> set[str]:
    return {p for p in os.listdir("/dev/shm") if p.startswith("polar-shm-")} if os.path.isdir("/dev/shm") else set()


def test_shared_memory_steps_equal_socket_steps_and_never_cross_the_socket():
    before = shm_folders()
    envs = {sm: cartpole(sm) for sm in (True, False)}
    try:
        assert envs[True].procs[0].shared_memory and not envs[False].procs[0].shared_memory  # the setting decides
        assert shm_folders() == before  # the mapping's file is unlinked once both sides hold it
        for e in envs.values():
            e.reset(seed=3)
        frames = {sm: e.procs[0]._conn.frames_received for sm, e in envs.items()}
        rng = np.random.default_rng(0)
        ended = 0
        for _ in range(300):
            actions = rng.integers(0, 2, 4)
            (obs1, rew1, term1, trunc1, info1), (obs0, rew0, term0, trunc0, info0) = (envs[True].step(actions),
                                                                                      envs[False].step(actions))
            assert obs1.dtype == obs0.dtype == np.float32 and rew1.dtype == rew0.dtype == np.float64
            assert term1.dtype == trunc1.dtype == bool
            np.testing.assert_array_equal(obs1, obs0)
            np.testing.assert_array_equal(rew1, rew0)
            np.testing.assert_array_equal(term1, term0)
            np.testing.assert_array_equal(trunc1, trunc0)
            assert sorted(info1) == sorted(info0)
            if "final_obs" in info0:
                ended += 1
                np.testing.assert_array_equal(info1["_final_obs"], info0["_final_obs"])
                for i in np.flatnonzero(info0["_final_obs"]):
                    np.testing.assert_array_equal(info1["final_obs"][i], info0["final_obs"][i])
        assert ended > 10
        assert envs[True].procs[0]._conn.frames_received == frames[True]  # 300 steps, no frame: all in the mapping
        assert envs[False].procs[0]._conn.frames_received == frames[False] + 300
    finally:
        for e in envs.values():
            e.close()


def test_a_connector_that_dies_mid_step_is_seen_dead_and_restarted_with_a_fresh_mapping(caplog):
    spec = make_spec("CountingConnector", config={"exit_at": 3}, call_timeout_s=60.0)
    envs = ConnectorVectorEnv(spec, 1, config_dir=CONNECTORS_DIR)
    try:
        assert envs.procs[0].shared_memory
        envs.reset()
        envs.step(np.array([0]))
        envs.step(np.array([0]))
        with caplog.at_level(logging.WARNING, logger="polar.connector"):
            _, reward, term, trunc, info = envs.step(np.array([0]))  # exits inside step: the socket closes
        assert trunc[0] and not term[0] and reward[0] == 0.0 and info[RESTART_KEY][0] and envs.restarts == 1
        assert "the process died (exit code 3)" in caplog.text  # seen by the closed socket, not the 60 s timeout
        assert envs.procs[0].shared_memory  # the fresh process maps a fresh file
        _, reward, *_ = envs.step(np.array([0]))
        assert reward[0] == 1.0
    finally:
        envs.close()


def test_a_hung_connector_runs_into_call_timeout_despite_the_spin(tmp_path, caplog):
    config = {"length": 50, "hang_once_at": 3, "hang_flag": str(tmp_path / "hung")}
    envs = ConnectorVectorEnv(make_spec("CountingConnector", config=config, call_timeout_s=2.0), 2,
                              config_dir=CONNECTORS_DIR)
    try:
        assert envs.procs[0].shared_memory
        envs.reset()
        envs.step(np.array([0, 0]))
        envs.step(np.array([0, 0]))
        with caplog.at_level(logging.WARNING, logger="polar.connector"):
            _, _, _, trunc, info = envs.step(np.array([0, 0]))  # copy 0's third step hangs
        assert (tmp_path / "hung").exists() and trunc.all() and info[RESTART_KEY].all() and envs.restarts == 1
        assert "no reply within 2 s" in caplog.text
    finally:
        envs.close()


def test_wait_sleeps_until_a_wake_frame_and_reports_a_closed_peer_or_a_deadline():
    shared, path = SharedSteps.create(2, ((2,), np.dtype("<i8")), ((2, 3), np.dtype("<f4")))
    SharedSteps.remove(path)
    a, b = socket.socketpair()
    waiter, peer = FrameSocket(a), FrameSocket(b)
    waiter.skip_empty = True
    with pytest.raises(ConnectorTimeout):
        shared.wait(shm.REP_SEQ, 0, shm.POLAR_WAITING, waiter, time.monotonic() + 0.05, spin_s=0.001)
    assert shared.slots[shm.POLAR_WAITING] == 0

    def reply_later() -> None:
        while not shared.slots[shm.POLAR_WAITING]:  # the waiter has given up spinning and sleeps on the socket
            time.sleep(0.001)
        shared.publish(shm.REP_SEQ, shm.REP_KIND, shm.KIND_SHARED, 1)
        peer.send_wake()

    t = threading.Thread(target=reply_later)
    t.start()
    assert shared.wait(shm.REP_SEQ, 0, shm.POLAR_WAITING, waiter, time.monotonic() + 30, spin_s=0.0) == 1
    t.join()
    b.close()
    with pytest.raises(ConnectionClosed):
        shared.wait(shm.REP_SEQ, 1, shm.POLAR_WAITING, waiter, time.monotonic() + 30, spin_s=0.0)
    a.close()
