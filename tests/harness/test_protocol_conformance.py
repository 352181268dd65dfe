"""Connector replies that break docs/connector-protocol.md: each gets a ProtocolError naming what broke.

The connector is ``connectors/raw_connector.py``, a real process that speaks the wire protocol
directly and deviates from it in one way per ``RAW_FAULT``. Each deviation is checked where a user
meets it: the vector env a run steps, ``polar run`` as a subprocess, and ``polar check``.
"""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polar.cli.main import main as polar_main
from polar.config.harness import ConnectorSpec
from polar.errors import ProtocolError
from polar.harness.connector import shm
from polar.harness.connector.vector_env import ConnectorEnv, ConnectorVectorEnv
from polar.harness.connector.wire import FrameSocket

from .conftest import CONNECTORS_DIR

RAW = CONNECTORS_DIR / "raw_connector.py"
BOX = "Box(0.0, 100.0, (5,), float32)"
DOCS = " (see docs/connector-protocol.md)"


def raw_spec(fault: str, **kw) -> ConnectorSpec:
    base = dict(command=[sys.executable, str(RAW)], env={"RAW_FAULT": fault}, call_timeout_s=30.0,
                start_timeout_s=30.0, restart_backoff_s=0.05, heartbeat_interval_s=0, max_restarts=0)
    base.update(kw)
    return ConnectorSpec(**base)


def raw_config(tmp_path: Path, fault: str) -> Path:
    """A run config training PPO on the raw connector for a few steps, 4 copies in the learner."""
    path = tmp_path / f"{fault or 'ok'}.yaml"
    path.write_text(f"""\
name: raw_walk
seed: 0
harness:
  type: custom
  connector_spec:
    command: [{sys.executable}, {RAW}]
    env: {{RAW_FAULT: {fault or "none"}}}
    heartbeat_interval_s: 0
agent: {{type: mlp, hidden_sizes: [8]}}
policy:
  type: ppo
  kwargs: {{n_steps: 8, batch_size: 32, n_epochs: 1}}
distribution: {{backend: local, rollout_workers: 0, envs_per_worker: 4}}
total_env_steps: 64
eval: {{episodes: 1}}
""")
    return path


def polar_run(config: Path, run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(config), "--run-dir",
                           str(run_dir), "--no-progress"], capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------------------------------ final_obs
def test_missing_final_obs_is_optional_and_obs_stands_in(caplog):
    """Copy i of a process ends after 3 + i steps (action 0: truncated); the connector never sends final_obs.

    Two processes of two copies: copies 0 and 2 end at step 3, copies 1 and 3 at step 4."""
    envs = ConnectorVectorEnv(raw_spec("no_final_obs", copies_per_process=2), 4)
    try:
        envs.reset()
        with caplog.at_level(logging.WARNING, logger="polar.connector"):
            for step in range(1, 5):
                obs, rewards, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
                assert rewards.dtype == np.float64 and rewards.tolist() == [1.0] * 4
                ended = {3: [0, 2], 4: [1, 3]}.get(step, [])
                assert trunc.tolist() == [i in ended for i in range(4)] and not term.any()
                if ended:
                    assert infos["_final_obs"].tolist() == trunc.tolist()
                    assert infos["final_info"] == {}  # no final_infos either: empty infos
                    for i in ended:
                        np.testing.assert_array_equal(infos["final_obs"][i], obs[i])  # obs stands in
                else:
                    assert "final_obs" not in infos
        warnings = [r.getMessage() for r in caplog.records if "without a final_obs" in r.getMessage()]
        assert warnings == ["RawWalk: copy 0 was truncated without a final_obs; learners bootstrap from its reported "
                            "obs (the next episode's first); send final_obs for truncated copies "
                            "(docs/connector-protocol.md, step)"]  # once, not once per episode
        # a terminated episode needs no final_obs at all: action 1 ends copy 0's next episode terminated
        for _ in range(2):  # copies 0 and 2 restarted at step 3: their next episodes end at step 6
            obs, _, term, trunc, infos = envs.step(np.ones(4, dtype=np.int64))
        assert term.tolist() == [True, False, True, False] and not trunc.any()
        assert infos["_final_obs"].tolist() == [True, False, True, False]
    finally:
        envs.close()


def test_missing_final_obs_single_env_returns_the_episode_end():
    env = ConnectorEnv(raw_spec("no_final_obs"))
    try:
        env.reset()
        out = [env.step(0) for _ in range(3)]
        obs, reward, terminated, truncated, info = out[-1]
        assert (reward, terminated, truncated, info) == (1.0, False, True, {})
        assert obs.shape == (5,) and obs.dtype == np.float32
    finally:
        env.close()


def test_polar_run_trains_on_a_connector_without_final_obs(tmp_path):
    p = polar_run(raw_config(tmp_path, "no_final_obs"), tmp_path / "run")
    assert p.returncode == 0, p.stderr
    assert "KeyError" not in p.stderr
    assert (tmp_path / "run" / "metrics.jsonl").read_text().strip()


def test_polar_check_passes_a_connector_without_final_obs(tmp_path, capsys):
    assert polar_main(["check", str(raw_config(tmp_path, "no_final_obs")), "--steps", "40"]) == 0
    assert "conforms" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ shapes
SHAPE_FAULTS = {
    "obs_shape": "RawWalk (connector-0, copies 0-1): the step reply's 'obs' has shape (2, 8), expected (2, 5): "
                 f"2 observation(s) of {BOX}" + DOCS,
    "reset_obs_shape": "RawWalk (connector-0, copies 0-1): the reset reply's 'obs' has shape (2, 8), expected (2, 5): "
                       f"2 observation(s) of {BOX}" + DOCS,
    "rewards_short": "RawWalk (connector-0, copies 0-1): the step reply's 'rewards' has shape (1,), expected (2,) "
                     "(one per copy)" + DOCS,
    "final_obs_shape": "RawWalk (connector-0, copy 1): the step reply's 'final_obs'[1] has shape (3,), expected (5,): "
                       f"one observation of {BOX}" + DOCS,
    "final_obs_short": "RawWalk (connector-0, copies 0-1): the step reply's 'final_obs' has 1 entries, expected a list "
                       "of 2 (one per copy, nil if not ended)" + DOCS,
}


@pytest.mark.parametrize("fault", sorted(SHAPE_FAULTS))
def test_bad_shapes_are_protocol_errors_naming_field_shapes_and_copy(fault):
    envs = ConnectorVectorEnv(raw_spec(fault, copies_per_process=2), 4)
    try:
        with pytest.raises(ProtocolError) as err:
            envs.reset()
            for _ in range(4):  # the last copy of each process ends (and sends final_obs) at step 4
                envs.step(np.zeros(4, dtype=np.int64))
        assert str(err.value) == SHAPE_FAULTS[fault]
    finally:
        envs.close()


@pytest.mark.parametrize(("fault", "message"), [
    ("obs_shape", "RawWalk (connector-0, copies 0-3): the step reply's 'obs' has shape (4, 8), expected (4, 5): "
                  f"4 observation(s) of {BOX}" + DOCS),
    ("rewards_short", "RawWalk (connector-0, copies 0-3): the step reply's 'rewards' has shape (3,), expected (4,) "
                      "(one per copy)" + DOCS),
])
def test_polar_run_reports_a_bad_shape_in_one_line(tmp_path, fault, message):
    p = polar_run(raw_config(tmp_path, fault), tmp_path / "run")
    assert p.returncode == 1
    assert f"error: {message}" in p.stderr.splitlines(), p.stderr
    assert "Traceback" not in p.stderr and "matmul" not in p.stderr and "broadcast" not in p.stderr


@pytest.mark.parametrize(("fault", "message"), [
    ("obs_shape", "RawWalk (connector-0, copy 0): the step reply's 'obs' has shape (1, 8), expected (1, 5): "
                  f"1 observation(s) of {BOX}" + DOCS),
    ("rewards_short", "RawWalk (connector-0, copy 0): the step reply's 'rewards' has shape (0,), expected (1,) "
                      "(one per copy)" + DOCS),
    ("final_obs_shape", "RawWalk (connector-0, copy 0): the step reply's 'final_obs'[0] has shape (3,), expected (5,): "
                        f"one observation of {BOX}" + DOCS),
])
def test_polar_check_reports_a_bad_shape(tmp_path, capsys, fault, message):
    assert polar_main(["check", str(raw_config(tmp_path, fault)), "--steps", "40"]) == 1
    out = " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping
    assert message in out
    assert "connector replies as docs/connector-protocol.md specifies" in out
    assert "TypeError" not in out and "IndexError" not in out


# ------------------------------------------------------------------------------------ garbage
def test_garbage_instead_of_the_hello_says_the_peer_is_not_a_polar_connector():
    with pytest.raises(ProtocolError) as err:
        ConnectorVectorEnv(raw_spec("garbage_hello"), 1)
    text = str(err.value)
    assert (r": the peer does not speak the polar connector protocol: its first bytes are b'GET / HTTP/1.1\r\n' "
            "(read as a frame header: incoming frame of 1195725856 bytes exceeds max_frame_bytes=67108864, where a "
            "hello takes a few hundred). A frame is a 4-byte big-endian length, then a msgpack map; check that the "
            "connector implements docs/connector-protocol.md") in text, text
    assert "raise connector_spec.max_frame_bytes" not in text


def test_a_first_frame_that_is_not_msgpack_says_the_peer_is_not_a_polar_connector():
    with pytest.raises(ProtocolError) as err:
        ConnectorVectorEnv(raw_spec("text_frame_hello"), 1)
    assert str(err.value).endswith("does not speak the polar connector protocol: its first frame, the hello, cannot be "
                                   r"decoded: malformed msgpack frame of 11 bytes starting b'\xc1not-a-hell' (FormatError)")


@pytest.mark.parametrize(("fault", "message"), [
    ("garbage_step", "RawWalk: its reply to 'step' cannot be decoded: malformed msgpack frame of 14 bytes starting "
                     r"b'\xc1\xc1 not msgpack' (FormatError)"),
    ("text_step", r"RawWalk: the peer wrote bytes that are not a polar frame: b'Traceback (most ' (read as a frame "
                  "header they announce 1416782179 bytes, over max_frame_bytes=67108864); a connector writes only "
                  "frames to its socket and prints to stdout or stderr"),
])
def test_a_malformed_frame_mid_run_says_what_was_malformed(fault, message):
    envs = ConnectorVectorEnv(raw_spec(fault, env={"RAW_FAULT": fault, "RAW_FAULT_AT": "2"}), 2)
    try:
        envs.reset()
        envs.step(np.zeros(2, dtype=np.int64))  # step 1 is fine
        with pytest.raises(ProtocolError) as err:
            envs.step(np.zeros(2, dtype=np.int64))
        assert str(err.value) == message
    finally:
        envs.close()


def test_frame_socket_first_frame_garbage_quotes_the_bytes():
    a, b = socket.socketpair()
    try:
        a.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        with pytest.raises(ProtocolError, match=re.escape("does not speak the polar connector protocol: its first "
                                                          "bytes are b'SSH-2.0-OpenSSH_'")):
            FrameSocket(b).recv(timeout_s=30)
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not shm.supported(), reason="shared-memory steps are offered on x86-64 only")
def test_a_wrong_shared_memory_reply_counter_is_one_line_naming_both_counters():
    envs = ConnectorVectorEnv(raw_spec("shm_bad_counter"), 2)
    try:
        assert envs.procs[0].shared_memory
        with pytest.raises(ProtocolError) as e:
            envs.reset()
    finally:
        envs.close()
    assert str(e.value).startswith("RawWalk: its shared-memory reply counter says 6, expected 1;")
    assert "\n" not in str(e.value)
