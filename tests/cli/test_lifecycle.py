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


# ---------------------------------------------------------------------------------------------- status, stops
SCRIPTED_ENV = '''
"""CartPole that hangs or crashes after LIFECYCLE_AFTER steps (all copies together), per LIFECYCLE_MODE."""
import os
import pathlib
import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class ScriptedCartPole(CartPoleEnv):
    steps = 0

    def __init__(self, **kwargs):
        if os.environ.get("LIFECYCLE_MODE") == "init":
            raise RuntimeError("scripted env failure in __init__")
        super().__init__(**kwargs)

    def step(self, action):
        ScriptedCartPole.steps += 1
        mode = os.environ.get("LIFECYCLE_MODE")
        if mode and ScriptedCartPole.steps > int(os.environ.get("LIFECYCLE_AFTER", "0")):
            pathlib.Path(os.environ["LIFECYCLE_MARKER"]).touch()
            if mode == "hang":
                time.sleep(3600)
            if mode == "crash":
                raise RuntimeError(f"scripted env crash at step {ScriptedCartPole.steps}")
        return super().step(action)


gym.register("ScriptedCartPole-v0", entry_point=ScriptedCartPole, max_episode_steps=500)
'''


def scripted_run(tmp_path: Path, mode: str | None, *overrides: str, after: int = 768) -> subprocess.Popen:
    """CartPole PPO in the learner (8 copies, 256 steps an iteration), scripted to hang or crash after
    ``after`` env steps; checkpoints every iteration."""
    (tmp_path / "lifecycle_envs.py").write_text(SCRIPTED_ENV)
    env = {**os.environ, "PYTHONPATH": with_path(tmp_path), "LIFECYCLE_AFTER": str(after),
           "LIFECYCLE_MARKER": str(tmp_path / "marker")}
    env.pop("LIFECYCLE_MODE", None)
    if mode:
        env["LIFECYCLE_MODE"] = mode
    args = ["run", "--config", CARTPOLE, "--run-dir", tmp_path / "run", "--no-progress",
            "-o", "harness.id=lifecycle_envs:ScriptedCartPole-v0", "-o", "logging.checkpoint_freq=1",
            "-o", "eval.episodes=2", "-o", "stop_reward=null"]
    for o in overrides:
        args += ["-o", o]
    return subprocess.Popen(polar_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env, start_new_session=True)


def with_path(directory: Path) -> str:
    return os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH")) if p)


def meta(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt_*.pt"))


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_write_a_final_checkpoint_and_say_interrupted(tmp_path, how):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it, rollout worker included) and SIGTERM:
    the learner ends its iteration, writes a checkpoint, records `interrupted` and exits 130 / 143."""
    run = tmp_path / "run"
    proc = start_run(CARTPOLE, run, "distribution.rollout_workers=1", "total_env_steps=100000000",
                     "logging.checkpoint_freq=0", "stop_reward=null", "eval.at_end=false")
    procs: list[psutil.Process] = []
    try:
        wait_for(lambda: metrics_rows(run), "first metrics row", proc)
        procs = descendants(proc.pid)
        assert checkpoints(run) == []  # checkpoint_freq 0: only a final checkpoint would write one
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_all(procs)
    assert proc.returncode == (130 if how == "ctrl-c" else 143), err[-3000:]
    m = meta(run)
    assert m["status"] == "interrupted", m
    assert m["signal"] == ("SIGINT" if how == "ctrl-c" else "SIGTERM")
    assert len(checkpoints(run)) == 1 and m["checkpoint"].endswith(checkpoints(run)[0]), (m, checkpoints(run))
    assert "final checkpoint" in err and f"polar resume {run}" in err, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    assert not wait_gone(procs)


def test_sigterm_grace_period_runs_out_and_the_status_says_so(tmp_path):
    """An iteration that hangs: after logging.sigterm_grace_s the run stops without a final checkpoint, exits
    143, and run.json says interrupted with no checkpoint and why."""
    proc = scripted_run(tmp_path, "hang", "distribution.rollout_workers=0", "logging.sigterm_grace_s=1",
                        "total_env_steps=100000000")
    run = tmp_path / "run"
    try:
        wait_for(lambda: (tmp_path / "marker").exists(), "the env to hang", proc)
        before = checkpoints(run)
        assert before, "three iterations were checkpointed before the hang"
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)  # the env hangs for an hour: only the grace period ends this
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err[-3000:]
    m = meta(run)
    assert m["status"] == "interrupted" and m["signal"] == "SIGTERM" and m["checkpoint"] is None, m
    assert "grace period of 1 s" in m["error"] and "without" in m["error"], m
    assert checkpoints(run) == before
    assert "grace period" in err and "Traceback" not in err, err[-3000:]


@pytest.mark.parametrize("mode", ["crash", "init"])
def test_a_run_that_fails_records_failed_with_the_error(tmp_path, mode):
    """A crash mid-run and a failure while starting both end as `failed` with the error (was: running/created)."""
    proc = scripted_run(tmp_path, mode, "distribution.rollout_workers=0", "total_env_steps=100000000")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    m = meta(tmp_path / "run")
    assert m["status"] == "failed", m
    assert "RuntimeError: scripted env" in m["error"] and "\n" not in m["error"], m


def test_a_killed_run_is_reported_killed_by_resume_and_eval(tmp_path):
    """SIGKILL writes nothing: the run is recorded `running` with a dead owner. run_status says killed, `polar
    eval` and `polar resume` say so, and resume refuses while the owner is still alive."""
    from polar.trainers.run_dir import run_status

    run = tmp_path / "run"
    proc = scripted_run(tmp_path, "hang", "distribution.rollout_workers=0", "total_env_steps=2048")
    try:
        wait_for(lambda: (tmp_path / "marker").exists(), "the env to hang", proc)
        assert run_status(run)["status"] == "running"
        busy = subprocess.run(polar_cmd("resume", run, "--no-progress"), capture_output=True, text=True, cwd=tmp_path,
                              timeout=120)
        assert busy.returncode == 1 and "is still running" in busy.stderr and str(proc.pid) in busy.stderr, busy.stderr
        assert len(busy.stderr.strip().splitlines()) == 1, busy.stderr
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert meta(run)["status"] == "running"  # nothing could write at SIGKILL
    st = run_status(run)
    assert st["status"] == "killed" and st["pid"] == proc.pid, st

    ev = subprocess.run(polar_cmd("eval", run, "--episodes", "1", "--trust-code"), capture_output=True, text=True, cwd=tmp_path,
                        env={**os.environ, "PYTHONPATH": with_path(tmp_path)}, timeout=300)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "run status: killed" in ev.stderr, ev.stderr[-3000:]

    res = subprocess.run(polar_cmd("resume", run, "--no-progress"), capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": with_path(tmp_path)}, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "run status: killed" in res.stderr, res.stderr[-3000:]
    m = meta(run)
    assert m["status"] == "finished" and m["process"]["pid"] != proc.pid, m


# ---------------------------------------------------------------------------------------------- start-up errors
BAD_STARTS = {
    "unknown gym id": ("cartpole", ["harness.id=CartPoel-v1"], "unknown Gymnasium id 'CartPoel-v1'"),
    "missing connector program": ("line_walk", ["harness.connector_spec.command=[no-such-node, line_walk.js]"],
                                  "executable 'no-such-node' not found on PATH"),
    "missing connector module": ("module.yaml", [], "connector_spec.module 'no_such_connector_mod' not found"),
    "missing agent module": ("agent.yaml", [], "agent.module: module 'no_such_agent_mod' not found"),
    "missing agent program": ("agent_cli.yaml", [], "harness.command: executable 'no-such-agent-cli' not found"),
}
BAD_CONFIGS = {
    "module.yaml": "name: m\nharness:\n  type: custom\n  connector_spec: {module: no_such_connector_mod, class_name: Env}\n"
                   "policy: {type: ppo}\n",
    "agent.yaml": "name: a\nharness: {type: gymnasium, id: CartPole-v1}\n"
                  "agent: {type: custom, module: no_such_agent_mod, class_name: Net}\npolicy: {type: ppo}\n",
    "agent_cli.yaml": "name: c\nharness: {type: agent, command: [no-such-agent-cli]}\ntasks: tasks.jsonl\n"
                      "model: {name_or_path: tiny}\npolicy: {type: grpo}\n",
}


@pytest.mark.parametrize("case", list(BAD_STARTS))
def test_start_up_errors_come_before_the_run_directory(tmp_path, case):
    """Unknown ids, missing programs and missing modules: one line, and no run directory was created."""
    config, overrides, expected = BAD_STARTS[case]
    path = {"cartpole": CARTPOLE, "line_walk": LINE_WALK}.get(config)
    if path is None:
        path = tmp_path / config
        path.write_text(BAD_CONFIGS[config])
        (tmp_path / "tasks.jsonl").write_text('{"prompt": "What is 1 + 1?"}\n')
    args = ["run", "--config", path, "--no-progress"]
    for o in overrides:
        args += ["-o", o]
    p = subprocess.run(polar_cmd(*args), capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 1, p.stderr[-3000:]
    assert expected in p.stderr, p.stderr[-3000:]
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr[-3000:]
    assert not (tmp_path / "runs").exists(), list((tmp_path / "runs").rglob("*"))


AGENT_RUNNER = """
import asyncio, sys
from polar.harness.agent.process import ProcessLimits, run_process
cmd = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"]
asyncio.run(run_process(cmd, cwd=".", env={"PATH": "/usr/bin:/bin"}, stdin=None, timeout_s=600,
                        limits=ProcessLimits(), cancel=None))
"""


def test_an_agent_harness_process_dies_with_its_sigkilled_runner(tmp_path):
    """An agent CLI runs in its own session (so one killpg ends it); SIGKILL of polar must still end it."""
    marker = tmp_path / "agent.pid"
    script = AGENT_RUNNER.replace("print(os.getpid(), flush=True)", f"open({str(marker)!r}, 'w').write(str(os.getpid()))")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    child = None
    try:
        child = psutil.Process(int(wait_for(lambda: marker.exists() and marker.read_text(), "the agent's pid", parent)))
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        assert not wait_gone([child]), "the agent process outlived polar"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child is not None:
            kill_all([child])
