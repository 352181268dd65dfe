"""What polar says about a failing connector: its own name, its last output, restarts counted per process."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from polar.cli.main import main as polar_main
from polar.config import load_config
from polar.errors import ConnectorCrashed
from polar.harness import make_vector_env
from polar.harness.connector.vector_env import ConnectorVectorEnv

from .conftest import CONNECTORS_DIR, make_spec

ROOT = Path(__file__).resolve().parents[2]


def test_check_quotes_the_last_output_lines_of_a_connector_that_keeps_dying(capsys, monkeypatch):
    monkeypatch.chdir(CONNECTORS_DIR)
    code = polar_main(["check", "sample_connectors:CountingConnector", "--steps", "20",
                       "-o", "harness.connector_spec.config.exit_at=1", "-o", "harness.connector_spec.max_restarts=0"])
    assert code == 1
    out = " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping
    assert "failed 1 times in a row" in out and "Its last output lines:" in out
    after = out.split("Its last output lines:", 1)[1]
    assert "fatal: reactor core breach" in after  # the line the connector printed before it died


def test_check_quotes_the_output_of_a_command_connector_that_fails_to_start(tmp_path, capsys):
    script = "print('loading assets.pak', flush=True); raise SystemExit('assets.pak is missing')"
    harness = tmp_path / "harness.yaml"
    harness.write_text(f"harness:\n  type: custom\n  connector_spec:\n    command: [{sys.executable}, -c, \"{script}\"]\n")
    assert polar_main(["check", str(harness)]) == 1
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "failed to start: the process exited with code 1 before connecting" in flat
    assert "connector output:" in out and "loading assets.pak" in out and "assets.pak is missing" in out


def _command_spec(**config):
    """CountingConnector behind a ``command:`` launcher: polar sees only an executable until the connector speaks."""
    command = [sys.executable, "-m", "polar.harness.connector.server", "--module", "sample_connectors",
               "--class-name", "CountingConnector", "--search-path", str(CONNECTORS_DIR)]
    return make_spec(None, module=None, command=command, config=config, max_restarts=0)


def test_errors_name_the_class_the_connector_declared_not_its_launcher():
    envs = ConnectorVectorEnv(_command_spec(exit_at=2), 1, config_dir=CONNECTORS_DIR)
    try:
        assert envs.name == "CountingConnector"
        envs.reset()
        envs.step(np.array([0]))
        with pytest.raises(ConnectorCrashed) as e:
            envs.step(np.array([0]))
    finally:
        envs.close()
    msg = str(e.value)
    assert msg.startswith("CountingConnector (connector-0) failed 1 times in a row"), msg
    assert os.path.basename(sys.executable) not in msg.splitlines()[0]


def test_process_restarts_and_restarted_copies_are_counted_apart():
    spec = make_spec("CountingConnector", config={"length": 50}, copies_per_process=2)
    envs = ConnectorVectorEnv(spec, 4, config_dir=CONNECTORS_DIR)
    try:
        envs.reset()
        for _ in range(3):  # the second process (copies 2 and 3) dies three times
            os.kill(envs.pids[1], signal.SIGKILL)
            _, _, _, trunc, _ = envs.step(np.zeros(4, dtype=np.int64))
            assert trunc.tolist() == [False, False, True, True]
        assert envs.restarts == 3 and envs.copies_restarted == 6
    finally:
        envs.close()


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_a_node_connector_is_named_by_its_class_not_by_node():
    cfg = load_config(ROOT / "examples" / "node_connector" / "line_walk.yaml",
                      overrides=["harness.connector_spec.max_restarts=0"])
    envs = make_vector_env(cfg.harness, 2, config_dir=cfg.config_dir)
    try:
        assert envs.procs[0].name == "LineWalk"
        envs.reset()
        os.kill(envs.pids[0], signal.SIGKILL)
        with pytest.raises(ConnectorCrashed) as e:
            envs.step(np.ones(2, dtype=np.int64))
    finally:
        envs.close()
    assert str(e.value).startswith("LineWalk (connector-0) failed 1 times in a row")


def test_a_command_connector_next_to_its_config_runs_by_its_bare_name(tmp_path):
    """`command: [game.sh]` with game.sh beside the config passes polar's start-up check, so it must also start
    (exec alone would search only PATH and fail after the check said yes)."""
    launcher = tmp_path / "game.sh"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -m polar.harness.connector.server --module sample_connectors "
                        f"--class-name CountingConnector --search-path {CONNECTORS_DIR}\n")
    launcher.chmod(0o755)
    envs = ConnectorVectorEnv(make_spec(None, module=None, command=["game.sh"], max_restarts=0), 1, config_dir=tmp_path)
    try:
        assert envs.name == "CountingConnector"
    finally:
        envs.close()
