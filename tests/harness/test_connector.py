"""Connector envs against real connector processes: equivalence, Dict obs, bad input, transports."""

from __future__ import annotations

import tempfile
import time

import gymnasium as gym
import numpy as np
import pytest

from polar.config.harness import ConnectorSpec, CustomHarnessConfig
from polar.errors import (
    ConfigError,
    ConnectorRemoteError,
    ConnectorStartError,
    EnvContractError,
    ProtocolError,
)
from polar.harness import make_env, make_vector_env
from polar.harness.connector.vector_env import ConnectorVectorEnv

from .conftest import CONNECTORS_DIR, KEYDOOR_DIR, make_spec

GYM = "polar.harness.connector.gym_connector"


def test_cartpole_through_connectors_matches_sync_vector_env():
    """Same seeds, same actions: identical obs, rewards, dones and SAME_STEP info structure."""
    spec = make_spec("GymnasiumConnector", module=GYM, config={"id": "CartPole-v1"}, copies_per_process=2)
    envs = ConnectorVectorEnv(spec, 5)  # split 2 + 2 + 1 over three processes
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 5, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        assert [p.num_envs for p in envs.procs] == [2, 2, 1]
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        obs, _ = envs.reset(seed=3)
        ref_obs, _ = ref.reset(seed=3)
        np.testing.assert_array_equal(obs, ref_obs)
        rng = np.random.default_rng(0)
        finals = 0
        for _ in range(120):
            actions = rng.integers(0, 2, size=5)
            got, want = envs.step(actions), ref.step(actions)
            for g, w in zip(got[:4], want[:4], strict=False):
                np.testing.assert_array_equal(g, w)
            assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype
            assert set(got[4]) == set(want[4])
            if "final_obs" in want[4]:
                finals += 1
                np.testing.assert_array_equal(got[4]["_final_obs"], want[4]["_final_obs"])
                for i in np.flatnonzero(want[4]["_final_obs"]):
                    np.testing.assert_array_equal(got[4]["final_obs"][i], want[4]["final_obs"][i])
        assert finals > 0
    finally:
        envs.close()
        ref.close()


def test_pendulum_box_actions_through_connector():
    cfg = CustomHarnessConfig(connector_spec=make_spec("GymnasiumConnector", module=GYM, config={"id": "Pendulum-v1"}))
    envs = make_vector_env(cfg, 2, seed=0)
    try:
        assert isinstance(envs.single_action_space, gym.spaces.Box)
        obs, _ = envs.reset()
        for _ in range(5):
            obs, reward, _term, _trunc, _ = envs.step(np.array([[0.5], [-2.0]], dtype=np.float32))
            assert obs.shape == (2, 3) and reward.dtype == np.float64 and np.all(reward <= 0)
        with pytest.raises(EnvContractError, match=r"expected shape \(2, 1\)"):
            envs.step(np.zeros((2, 3), dtype=np.float32))
        obs, *_ = envs.step(np.zeros((2, 1), dtype=np.float32))  # still running after bad input
        assert obs.shape == (2, 3)
    finally:
        envs.close()


def test_keydoor_seed_config_gives_dict_obs_of_100_inputs():
    from polar.config import load_config

    cfg = load_config(KEYDOOR_DIR / "polar_train_config.yaml")
    envs = make_vector_env(cfg.harness, 3, seed=1, config_dir=cfg.config_dir)
    try:
        space = envs.single_observation_space
        assert isinstance(space, gym.spaces.Dict) and set(space.spaces) == {"visual", "inventory"}
        assert sum(s.shape[0] for s in space.spaces.values()) == cfg.agent.kwargs["obs_dim"] == 100
        assert envs.single_action_space == gym.spaces.Discrete(cfg.agent.kwargs["action_dim"])
        obs, _ = envs.reset()
        rng = np.random.default_rng(0)
        ended = np.zeros(3, dtype=bool)
        for _ in range(60):  # > max_steps (50): every copy ends an episode at least once
            obs, _, term, _trunc, info = envs.step(rng.integers(0, 4, 3))
            for i in range(3):
                assert space.contains({k: v[i] for k, v in obs.items()})
            if "final_info" in info:
                mask = info["_final_info"]
                assert np.all(info["final_info"]["_success"][mask])  # every ended episode says if it won
                np.testing.assert_array_equal(info["final_info"]["success"][mask], term[mask])
                ended |= mask
        assert ended.all()
    finally:
        envs.close()


def test_single_env_wrapper_and_inferred_dict_space():
    env = make_env(CustomHarnessConfig(connector_spec=make_spec("InferredConnector")), config_dir=CONNECTORS_DIR)
    try:
        assert env.observation_space["image"].dtype == np.uint8 and env.observation_space["image"].shape == (4, 4, 3)
        obs, _ = env.reset(seed=0)
        assert obs["vec"].shape == (3,)
        for t in range(1, 4):
            obs, reward, term, trunc, _info = env.step(np.array([0.25, 0.25], dtype=np.float32))
            assert obs["image"][0, 0, 0] == t  # the final obs of the episode, not the reset one
            assert reward == pytest.approx(0.5)
        assert term and not trunc
        obs, _ = env.reset()
        assert obs["image"].max() == 0
    finally:
        env.close()


def test_exception_in_step_names_class_and_carries_traceback():
    spec = make_spec("CountingConnector", config={"raise_at": 2, "length": 10}, copies_per_process=1)
    envs = ConnectorVectorEnv(spec, 2, config_dir=CONNECTORS_DIR)
    try:
        envs.reset()
        envs.step(np.array([0, 0]))
        with pytest.raises(ConnectorRemoteError) as e:
            envs.step(np.array([0, 0]))  # both processes raise; both replies are drained
        assert "CountingConnector.step raised ValueError: bad move at step 2" in str(e.value)
        assert 'raise ValueError(f"bad move' in e.value.remote_traceback
        obs, *_ = envs.step(np.array([0, 0]))  # the processes survived: nothing running was lost
        assert envs.restarts == 0 and obs[:, 0].tolist() == [3.0, 3.0]
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"module": "no_such_module", "class_name": "X"}, "connector_spec.module 'no_such_module' not found"),
        ({"class_name": "CountingConnecter"}, "did you mean: CountingConnector"),
        ({"class_name": "NoStepConnector"}, "has no 'step' method"),
    ],
)
def test_bad_connector_spec_fails_fast_with_one_clear_line(kw, message):
    with pytest.raises(ConnectorStartError) as e:
        ConnectorVectorEnv(make_spec(**{"class_name": "CountingConnector", **kw}), 1, config_dir=CONNECTORS_DIR)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_wrong_action_type_is_rejected_before_sending():
    envs = ConnectorVectorEnv(make_spec("CountingConnector"), 2, config_dir=CONNECTORS_DIR)
    try:
        envs.reset()
        with pytest.raises(EnvContractError, match=r"values must lie in \[0, 2\)"):
            envs.step(np.array([0, 7]))
        with pytest.raises(EnvContractError, match=r"expected 2 integers"):
            envs.step(np.array([[0, 1]]))
        with pytest.raises(EnvContractError, match="expected"):
            envs.step(np.array(["a", "b"]))
        _obs, reward, *_ = envs.step(np.array([0, 1]))
        assert reward.tolist() == [1.0, 1.0]
    finally:
        envs.close()


def test_stdout_prints_do_not_break_the_channel():
    envs = ConnectorVectorEnv(make_spec("CountingConnector", config={"print": True}), 2, config_dir=CONNECTORS_DIR)
    try:
        envs.reset()
        for _ in range(12):
            _obs, reward, *_ = envs.step(np.array([0, 1]))
        assert reward.tolist() == [1.0, 1.0]
        deadline = time.monotonic() + 10  # the drain thread reads the pipe on its own schedule
        while "stdout chatter step 12" not in envs.procs[0].tail_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "stdout chatter step 12" in envs.procs[0].tail_text()
    finally:
        envs.close()


def test_step_result_of_wrong_arity_is_a_contract_error():
    envs = ConnectorVectorEnv(make_spec("ThreeTupleConnector"), 1, config_dir=CONNECTORS_DIR)
    try:
        envs.reset()
        with pytest.raises(EnvContractError, match=r"ThreeTupleConnector.step returned a tuple of 3 items"):
            envs.step(np.array([0]))
    finally:
        envs.close()


def test_frame_cap_and_compression():
    spec = make_spec("BigObsConnector", max_frame_bytes=64 * 1024)
    with pytest.raises(ProtocolError, match=r"over max_frame_bytes=65536.*compression"):
        ConnectorVectorEnv(spec, 1, config_dir=CONNECTORS_DIR).reset()
    for codec in ("zstd",):  # PNG through a connector: tests/harness/test_keydoor.py
        envs = ConnectorVectorEnv(spec.model_copy(update={"compression": codec}), 1, config_dir=CONNECTORS_DIR)
        try:
            obs, _ = envs.reset()
            assert obs.shape == (1, 256, 256, 4) and obs.dtype == np.uint8 and obs.max() == 0
        finally:
            envs.close()


def test_tcp_transport_and_token_rule():
    spec = make_spec("CountingConnector", transport="tcp", copies_per_process=1)
    envs = ConnectorVectorEnv(spec, 2, config_dir=CONNECTORS_DIR)
    try:
        assert all(p.address.startswith("tcp:127.0.0.1:") for p in envs.procs) and len(envs.procs) == 2
        envs.reset()
        assert envs.step(np.array([0, 0]))[1].tolist() == [1.0, 1.0]
    finally:
        envs.close()
    from polar.config.base import validate

    with pytest.raises(ConfigError, match=r"not a loopback address: set connector_spec\.token"):
        validate(ConnectorSpec, {"module": "m", "class_name": "C", "transport": "tcp", "host": "0.0.0.0"})


IMPOSTOR = """
import os, socket, struct, msgpack
path = os.environ["POLAR_CONNECTOR_ADDRESS"].split(":", 1)[1]
s = socket.socket(socket.AF_UNIX); s.connect(path)
body = msgpack.packb({"type": "hello", "protocol": 1, "token": "guessed", "pid": os.getpid()})
s.sendall(struct.pack(">I", len(body)) + body)
s.recv(1)
"""


def test_a_connector_with_the_wrong_token_is_refused():
    import sys

    spec = ConnectorSpec(command=[sys.executable, "-c", IMPOSTOR], start_timeout_s=20, heartbeat_interval_s=0)
    with pytest.raises(ConnectorStartError, match="wrong token"):
        ConnectorVectorEnv(spec, 1)


CONNECTOR_SRC = """
import numpy as np
from gymnasium import spaces

class Where:
    action_space = spaces.Discrete(2)

    def __init__(self, config):
        pass

    def reset(self):
        return np.array([{value}], dtype=np.float32)

    def step(self, action):
        return self.reset(), 0.0, False, {info}
"""


def test_module_resolves_next_to_the_config_before_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cfg" / "where_mod.py").write_text(CONNECTOR_SRC.format(value=1.0, info="{}"))
    (tmp_path / "cwd" / "where_mod.py").write_text(CONNECTOR_SRC.format(value=2.0, info="{'bad': object()}"))
    monkeypatch.chdir(tmp_path / "cwd")
    spec = make_spec("Where", module="where_mod")
    envs = ConnectorVectorEnv(spec, 1, config_dir=tmp_path / "cfg")
    try:
        assert envs.reset()[0].tolist() == [[1.0]]
    finally:
        envs.close()
    envs = ConnectorVectorEnv(spec, 1, config_dir=tmp_path / "elsewhere")  # falls back to the cwd
    try:
        assert envs.reset()[0].tolist() == [[2.0]]
        with pytest.raises(EnvContractError, match="a value of type object cannot be sent"):
            envs.step(np.array([0]))  # an info value msgpack cannot carry: a clear error, not a crash
        assert envs.reset()[0].tolist() == [[2.0]]
    finally:
        envs.close()


def test_connector_code_can_be_upgraded_without_stopping(tmp_path):
    (tmp_path / "where_mod.py").write_text(CONNECTOR_SRC.format(value=1.0, info="{}"))
    envs = ConnectorVectorEnv(make_spec("Where", module="where_mod"), 2, config_dir=tmp_path)
    try:
        envs.reset()
        assert envs.step(np.array([0, 0]))[0].tolist() == [[1.0], [1.0]]
        # a different length, so Python never reuses the old bytecode even within the same mtime second
        (tmp_path / "where_mod.py").write_text(CONNECTOR_SRC.format(value=3.25, info="{}"))
        envs.restart_connectors()
        obs, _, term, trunc, info = envs.step(np.array([0, 0]))
        assert trunc.all() and not term.any() and info["polar/connector_restart"].all()
        assert obs.tolist() == [[3.25], [3.25]] and envs.restarts == 1
    finally:
        envs.close()


def test_a_temp_folder_too_deep_for_a_unix_socket_is_one_clear_line_and_tcp_still_works(tmp_path, monkeypatch):
    """A TMPDIR past the 107-byte AF_UNIX limit used to end in a bare ``OSError: AF_UNIX path too long``."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with pytest.raises(ConnectorStartError) as e:
        ConnectorVectorEnv(make_spec("CountingConnector"), 1, config_dir=CONNECTORS_DIR)
    assert "over the 107-byte AF_UNIX limit" in str(e.value) and "connector_spec.transport: tcp" in str(e.value)
    assert "\n" not in str(e.value)
    assert list(deep.iterdir()) == []  # its socket folder is not left behind
    env = ConnectorVectorEnv(make_spec("CountingConnector", transport="tcp"), 1, config_dir=CONNECTORS_DIR)
    try:
        env.reset(seed=0)
    finally:
        env.close()
