"""A connector is untrusted code in its own process: its whole process tree dies with the run (descendants in
new sessions and double-forked daemons included), its compressed frames cannot inflate past what it declared,
and the interpreter and the name polar shows are polar's own, not whatever the connector's PATH or command says.

Real processes throughout: `polar run` and `polar check` as subprocesses, connectors that fork, setsid() and
daemonize, pids read back from a file the descendants write, liveness read from /proc."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from polar.config.harness import ConnectorSpec
from polar.errors import ProtocolError
from polar.harness.connector.vector_env import ConnectorVectorEnv

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "connectors"
HARNESS_CONNECTORS = ROOT / "tests" / "harness" / "connectors"
ROLES = {"connector", "child", "setsid_grandchild", "double_forked_daemon"}
GONE_BUDGET_S = 10.0
START_BUDGET_S = 180.0


def polar_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "polar.cli.main", *map(str, args)]


def spec(**kw: object) -> ConnectorSpec:
    base: dict = dict(call_timeout_s=30.0, start_timeout_s=30.0, restart_backoff_s=0.05, heartbeat_interval_s=0)
    base.update(kw)
    return ConnectorSpec(**base)


# ------------------------------------------------------------------------------------------- processes
def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), or None when it is gone or a zombie:
    with the pid, it names one process even if the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def noted(pid_file: Path) -> dict[int, tuple[str, int | None]]:
    """pid -> (role, start time) of every process the connector's tree wrote to ``pid_file``."""
    out = {}
    if pid_file.exists():
        for line in pid_file.read_text().splitlines():
            role, pid = line.split()
            out[int(pid)] = (role, start_time(int(pid)))
    return out


def wait_tree(pid_file: Path, proc: subprocess.Popen | None = None, budget_s: float = START_BUDGET_S) -> dict:
    """Wait (bounded) until the pid file names every role, each alive; return what it names."""
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        tree = noted(pid_file)
        if {role for role, _ in tree.values()} >= ROLES:
            return tree
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"polar exited with {proc.returncode} before the connector's tree was up:\n{err[-3000:]}")
        time.sleep(0.05)  # polling interval of a bounded wait
    pytest.fail(f"the connector's tree did not write all of {sorted(ROLES)} to {pid_file} within {budget_s:.0f}s")


def survivors(tree: dict, budget_s: float = GONE_BUDGET_S) -> list[str]:
    """The processes of ``tree`` still alive (same pid, same start time) after at most ``budget_s``."""
    deadline = time.monotonic() + budget_s
    while True:
        left = [f"{role} pid {pid}" for pid, (role, t0) in tree.items() if t0 is not None and start_time(pid) == t0]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def kill_tree_of(tree: dict) -> None:
    """Test cleanup: never leave the escaped processes of a failed run behind."""
    for pid, (_, t0) in tree.items():
        if t0 is not None and start_time(pid) == t0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def escaping_run(tmp_path: Path, total_env_steps: int, rollout_workers: int = 0) -> tuple[subprocess.Popen, Path]:
    """`polar run` (PPO) on EscapingConnector, in its own session; returns the process and the pid file."""
    shutil.copy(HERE / "escaping_connector.py", tmp_path / "escaping_connector.py")
    pid_file = tmp_path / "pids"
    config = {
        "name": "escape", "seed": 0,
        "harness": {"type": "custom", "connector_spec": {
            "module": "escaping_connector", "class_name": "EscapingConnector", "config": {"pid_file": str(pid_file)}}},
        "agent": {"type": "mlp", "hidden_sizes": [8]},
        "policy": {"type": "ppo", "kwargs": {"n_steps": 16, "batch_size": 16, "n_epochs": 1}},
        "distribution": {"backend": "local", "rollout_workers": rollout_workers, "envs_per_worker": 1},
        "total_env_steps": total_env_steps,
        "eval": {"episodes": 1},
    }
    (tmp_path / "run.yaml").write_text(json.dumps(config))  # JSON is YAML
    proc = subprocess.Popen(polar_cmd("run", "--config", tmp_path / "run.yaml", "--run-dir", tmp_path / "run",
                                      "--no-progress"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True)
    return proc, pid_file


# ------------------------------------------------------------------------------------------- the tree
def test_connector_grandchild_in_its_own_session_and_daemon_die_when_polar_run_ends(tmp_path):
    proc, pid_file = escaping_run(tmp_path, total_env_steps=64)
    tree: dict = {}
    try:
        _, err = proc.communicate(timeout=START_BUDGET_S)
        assert proc.returncode == 0, err[-3000:]
        tree = noted(pid_file)
        assert {role for role, _ in tree.values()} >= ROLES, tree  # every escape was tried
        left = survivors(tree)
        assert not left, f"alive {GONE_BUDGET_S:.0f} s after `polar run` ended: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_tree_of({**noted(pid_file), **tree})


@pytest.mark.parametrize("rollout_workers", [0, 1], ids=["learner", "rollout_worker"])
def test_connector_grandchild_in_its_own_session_and_daemon_die_when_polar_run_is_sigkilled(tmp_path, rollout_workers):
    """kill -9 of `polar run`: no finally or atexit runs, yet the connector's whole tree dies (the connector
    started by the learner itself, or by a rollout worker that dies with it)."""
    proc, pid_file = escaping_run(tmp_path, total_env_steps=100_000_000, rollout_workers=rollout_workers)
    tree: dict = {}
    try:
        tree = wait_tree(pid_file, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        left = survivors(tree)
        assert not left, f"alive {GONE_BUDGET_S:.0f} s after kill -9 of `polar run`: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_tree_of({**noted(pid_file), **tree})
        proc.communicate()


def test_a_restarted_connectors_escaped_descendants_die_with_the_old_process(tmp_path):
    """The connector is SIGKILLed mid-run (a crash): polar restarts it, and the old process's descendants in
    other sessions do not pile up across restarts."""
    pid_file = tmp_path / "pids"
    envs = ConnectorVectorEnv(spec(module="escaping_connector", class_name="EscapingConnector",
                                   config={"pid_file": str(pid_file)}), 1, config_dir=HERE)
    tree: dict = {}
    try:
        envs.reset()
        tree = wait_tree(pid_file, budget_s=30)
        connector = next(pid for pid, (role, _) in tree.items() if role == "connector")
        assert envs.pids == [connector]  # polar names the connector's own pid, not its supervisor's
        os.kill(connector, signal.SIGKILL)
        _, _, _, truncated, _ = envs.step(np.zeros(1, dtype=np.int64))
        assert truncated.tolist() == [True] and envs.restarts == 1
        left = survivors(tree)
        assert not left, f"alive {GONE_BUDGET_S:.0f} s after their connector was restarted: {left}"
    finally:
        envs.close()
        kill_tree_of({**noted(pid_file), **tree})


def test_a_connector_that_stops_its_supervisor_still_dies_with_its_whole_tree(tmp_path):
    """The connector SIGSTOPs the process above it (its supervisor): polar's stop still ends the whole tree."""
    pid_file = tmp_path / "pids"
    envs = ConnectorVectorEnv(spec(module="escaping_connector", class_name="EscapingConnector",
                                   config={"pid_file": str(pid_file)}), 1, config_dir=HERE)
    tree: dict = {}
    try:
        envs.reset()
        tree = wait_tree(pid_file, budget_s=30)
        connector = next(pid for pid, (role, _) in tree.items() if role == "connector")
        above = int(Path(f"/proc/{connector}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])  # its parent
        if above == os.getpid():  # no process between polar and the connector: stopping it would stop this test
            pytest.fail("the connector's parent is polar itself: nothing contains its tree")
        os.kill(above, signal.SIGSTOP)
        envs.close()
        left = survivors(tree)
        assert not left, f"alive {GONE_BUDGET_S:.0f} s after polar closed a connector that stopped its parent: {left}"
    finally:
        envs.close()
        kill_tree_of({**noted(pid_file), **tree})


# ------------------------------------------------------------------------------------------- zstd bomb
BOMB_LEARNER = """
import os, sys
from polar.config.harness import ConnectorSpec
from polar.harness.connector.vector_env import ConnectorVectorEnv
spec = ConnectorSpec(command=[sys.executable, sys.argv[1]], max_restarts=0, heartbeat_interval_s=0,
                     env={"HOSTILE": sys.argv[2]})
try:
    envs = ConnectorVectorEnv(spec, 1)
    try:
        envs.reset()
        print("DECODED")
    finally:
        envs.close()
except Exception as e:
    print("ERROR", type(e).__name__, e)
# VmHWM: this program's own peak RSS (ru_maxrss would carry the forking parent's, kept across exec)
print("MAXRSS_KB", next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


@pytest.mark.parametrize(("attack", "op", "limit", "why"), [
    ("zstd_bomb", "reset", 67108880, "max_frame_bytes=67108864 + 2 x 1 copies x 8 bytes per declared observation"),
    ("init_bomb", "init", 67108864, "max_frame_bytes=67108864 + 2 x 0 bytes of declared spaces"),
    ("lying_header", "reset", None, "decodes to more than the 8 bytes its shape (1, 2) float32 needs"),
    ("map_bomb", "reset", None, "a frame of 16777230 bytes would build over 268435680 bytes of Python objects (16 x its size"),
], ids=["in_an_observation", "in_the_declared_space", "under_a_header_announcing_8_bytes", "msgpack_empty_maps"])
def test_decompression_bomb_from_a_connector_is_refused_without_inflating(attack, op, limit, why):
    """A connector replies with a 32 KiB zstd frame that inflates to 1 GiB: as an observation whose header says 1 GiB
    (it declared 2 floats), as the ``low`` of a space whose dtype claims a gigabyte per element, or under a header
    that announces the 8 bytes declared; or with 16 MiB of msgpack that decodes to 1.1 GiB of empty dicts. The
    learner refuses it in one line naming the connector and the limit (or the announced size), and never
    allocates the gigabyte."""
    res = subprocess.run([sys.executable, "-c", BOMB_LEARNER, str(HERE / "hostile_connector.py"), attack],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = res.stdout.splitlines()
    error = next((line for line in lines if line.startswith(("ERROR", "DECODED"))), None)
    assert error is not None and lines[-1].startswith("MAXRSS_KB"), res.stdout + res.stderr[-3000:]
    maxrss_mib = int(lines[-1].split()[1]) / 1024
    assert maxrss_mib < 512, f"the learner peaked at {maxrss_mib:.0f} MiB decoding one reply ({error})"
    assert error.startswith(f"ERROR ProtocolError ZstdBomb: its reply to '{op}' cannot be decoded"), error
    assert why in error and (limit is None or f"over the {limit}-byte limit" in error), error


def test_compressed_arrays_of_one_frame_share_one_decode_budget():
    """Many arrays each under the limit cannot add up past it: the budget is per frame, not per array."""
    from polar.harness.connector.wire import Codec

    block = np.zeros(1 << 20, dtype=np.uint8)  # 1 MiB of zeros: a few dozen bytes as zstd
    frame = Codec("zstd").pack({"obs": [block] * 8})
    assert len(frame) < 64 * 1024
    assert len(Codec(max_decoded_bytes=8 << 20).unpack(frame)["obs"]) == 8
    with pytest.raises(ProtocolError, match="over the 7340032-byte limit"):
        Codec(max_decoded_bytes=7 << 20).unpack(frame)


def test_connector_cannot_forge_log_lines_through_its_declared_name():
    """The class name a connector declares goes into every message about it: polar keeps it on one line and
    without terminal escape sequences."""
    envs = ConnectorVectorEnv(spec(command=[sys.executable, str(HERE / "hostile_connector.py")],
                                   env={"HOSTILE": "forged_name"}, max_restarts=0), 1)
    try:
        envs.reset()
        name = envs.name
    finally:
        envs.close()
    assert name.startswith("Game?2026-12-06") and name.isprintable() and len(name) <= 80, repr(name)


# ------------------------------------------------------------------------------------------- {python}, names
def test_python_placeholder_in_a_connector_command_runs_polars_interpreter(tmp_path):
    """``{python}`` in connector_spec.command is the interpreter running polar (sys.executable), as in agent
    commands, not an executable named '{python}' nor whatever ``python`` a PATH lookup finds first."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    impostor = fake_bin / "python"
    impostor.write_text("#!/bin/sh\necho impostor python >&2\nexit 3\n")
    impostor.chmod(0o755)
    report = tmp_path / "interpreter.txt"
    command = ["{python}", "-m", "polar.harness.connector.server", "--module", "escaping_connector",
               "--class-name", "InterpreterConnector", "--search-path", str(HERE)]
    envs = ConnectorVectorEnv(spec(command=command, config={"report": str(report)}, max_restarts=0,
                                   env={"PATH": f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}"}),
                              1, config_dir=tmp_path)
    try:
        assert envs.name == "InterpreterConnector"
    finally:
        envs.close()
    assert report.read_text() == sys.executable


def test_polar_check_names_a_command_connector_by_the_class_it_declared(tmp_path):
    command = [sys.executable, "-m", "polar.harness.connector.server", "--module", "sample_connectors",
               "--class-name", "CountingConnector", "--search-path", str(HARNESS_CONNECTORS)]
    harness = tmp_path / "harness.yaml"
    harness.write_text(json.dumps({"harness": {"type": "custom", "connector_spec": {"command": command}}}))
    res = subprocess.run(polar_cmd("check", harness, "--steps", "20"), capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={**os.environ, "COLUMNS": "300"})
    summary = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-2000:]
    # "<name> conforms (...)" or "<name>: N violation(s)": the name is the class, not the launcher's command line
    assert re.match(r"CountingConnector( conforms|: \d+ violation)", summary), summary
    assert "polar.harness.connector.server" not in res.stdout, res.stdout
