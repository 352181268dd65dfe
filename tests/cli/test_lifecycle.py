"""A run's lifecycle as a user and an operator see it: real `polar run` subprocesses killed, interrupted and
stopped, their run directories read back. Waits are on observable state (metrics rows, run.json), never sleeps."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "examples" / "cartpole_ppo.yaml"
LINE_WALK = ROOT / "examples" / "node_connector" / "line_walk.yaml"
START_BUDGET_S = 120.0  # a loaded 2-core CI box starts torch + a worker + a connector in far less

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")


def polar_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "polar.cli.main", *map(str, args)]


def start_run(config: Path, run_dir: Path, *overrides: str) -> subprocess.Popen:
    """`polar run` in its own session (so a test can signal its whole group, as a terminal does), from the
    run directory's parent (a default ``runs/`` lands there)."""
    args = ["run", "--config", config, "--run-dir", run_dir, "--no-progress"]
    for o in overrides:
        args += ["-o", o]
    return subprocess.Popen(polar_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=run_dir.parent, start_new_session=True)


def wait_for(predicate, what: str, proc: subprocess.Popen | None = None, budget_s: float = START_BUDGET_S):
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"polar exited with {proc.returncode} before {what}:\n{err[-3000:]}")
        time.sleep(0.05)  # polling interval of a bounded wait, not a synchronization sleep
    pytest.fail(f"no {what} within {budget_s:.0f}s")


def metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def run_status(run_dir: Path) -> str | None:
    with contextlib.suppress(OSError, json.JSONDecodeError):
        return json.loads((run_dir / "run.json").read_text()).get("status")
    return None


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def wait_gone(procs: list[psutil.Process], budget_s: float = 5.0) -> list[psutil.Process]:
    """The processes of ``procs`` still alive after at most ``budget_s`` (the bound the issue sets)."""
    deadline = time.monotonic() + budget_s
    left = alive(procs)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = alive(left)
    return left


def kill_all(procs: list[psutil.Process]) -> None:
    for p in alive(procs):
        with contextlib.suppress(psutil.Error):
            p.kill()


# ---------------------------------------------------------------------------------------------- orphans
@needs_node
def test_sigkill_leaves_no_process_of_the_run_alive(tmp_path):
    """kill -9 of `polar run`: its rollout worker, the forkserver and resource tracker, and the Node
    connector all die with it (no atexit or finally runs in a SIGKILLed learner)."""
    run = tmp_path / "run"
    proc = start_run(LINE_WALK, run, "distribution.rollout_workers=1", "total_env_steps=100000000")
    procs: list[psutil.Process] = []
    try:
        # "running" is written once the backend is up: every worker has collected a first fragment
        wait_for(lambda: run_status(run) == "running", "status running", proc)
        procs = descendants(proc.pid)
        names = [p.name() for p in procs]
        assert "node" in names, names
        assert len(procs) >= 4, [p.cmdline()[:3] for p in procs]  # worker, forkserver, resource tracker, node
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        left = wait_gone(procs)
        assert not left, f"alive 5 s after SIGKILL: {[(p.pid, p.cmdline()[:3]) for p in left]}"
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_all(procs)  # before reading its pipes: survivors would hold them open
        proc.communicate()


GRANDCHILD = """
import subprocess, sys, threading
from polar.lifetime import popen_tied
box = {}
t = threading.Thread(target=lambda: box.update(p=popen_tied([sys.executable, "-c", "import time; time.sleep(600)"])))
t.start(); t.join()  # spawned from a thread that has ended: the child must outlive that thread
print(box["p"].pid, flush=True)
sys.stdin.read()  # stay alive until the test kills this process
"""


def test_a_tied_child_outlives_the_spawning_thread_and_dies_with_its_process():
    """popen_tied: SIGKILL of the parent takes the child along (prctl parent-death signal), while the end of
    the thread that asked for the spawn does not (the signal follows the forking thread, hence a spawner)."""
    parent = subprocess.Popen([sys.executable, "-c", GRANDCHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT)
    child = None
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        assert alive([child]), "the child died with the thread that spawned it"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        assert not wait_gone([child]), "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if child is not None:
            kill_all([child])
        parent.communicate()
