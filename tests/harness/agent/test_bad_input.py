"""Harnesses that misbehave: each session ends ERROR with its reason, no training signal, no leftovers."""

import asyncio
import os
import uuid
from pathlib import Path

import psutil
import pytest

from polar.harness.agent.process import ProcessLimits
from polar.harness.agent.runners import CallableRunner, CommandRunner
from polar.harness.agent.verifiers import ExactMatch, UserFunction
from polar.rollout.sessions.local import LocalStack
from polar.rollout.sessions.pipeline import PipelineSettings
from polar.rollout.sessions.session import SessionStatus
from tests.agent_support.helpers import HERE, alive, python_cmd

BEHAVIOURS = ["ok", "exit_nonzero", "no_calls", "wrong_key", "big_output", "forker"]


@pytest.mark.parametrize("runtime", ["none", "bwrap"])
def test_misbehaving_command_harnesses(oracle_engine, tmp_path, no_leftovers, runtime):
    """Each misbehaviour ends its session ERROR with its reason, on the host (``runtime: none``) and in
    bubblewrap. A forked daemon is found and killed on the host (ERROR: it left a process); in bubblewrap it
    dies with the sandbox's pid namespace, and nothing of it is left on the host either."""
    if runtime == "bwrap":
        from polar.harness.agent.sandbox import bwrap_unusable

        if bwrap_unusable():
            pytest.skip(bwrap_unusable())
    marker = uuid.uuid4().hex
    # on the host the daemon's pid goes to a file of the test's; in the sandbox only its workspace is writable
    pid_file = tmp_path / "daemon.pid" if runtime == "none" else Path("daemon.pid")
    runner = CommandRunner(
        python_cmd(str(HERE / "behaviours.py"), "{behaviour}"), task_input="placeholders",
        env={"PID_FILE": str(pid_file), "POLAR_TEST_MARKER": marker}, limits=ProcessLimits(output_bytes=256 * 1024),
        sandbox={"runtime": runtime},
    )
    settings = PipelineSettings(agent_timeout_s=120, session_budget_s=300, workspace_root=str(tmp_path / "ws"),
                                keep_workspaces=True)
    with LocalStack(oracle_engine, runner, ExactMatch(), settings, records_dir=tmp_path / "rec") as stack:
        groups = stack.run_groups([({"id": b, "prompt": "say hello", "behaviour": b, "answer": "hello"}, 1, {})
                                   for b in BEHAVIOURS], timeout_s=600)
    res = {b: g[0] for b, g in zip(BEHAVIOURS, groups, strict=True)}

    ok = res["ok"]
    assert ok.status == SessionStatus.DONE and ok.reward == 1.0 and ok.trainable, ok.error

    expect = {
        "exit_nonzero": "exited with code 3",
        "no_calls": "made no model calls",
        "wrong_key": "belongs to another API key",  # its session is its own key's: another key is refused
        "big_output": "bytes of output",
    }
    if runtime == "none":
        expect["forker"] = "left 1 process"
    for name, reason in expect.items():
        r = res[name]
        assert r.status == SessionStatus.ERROR, (name, r.status, r.error)
        assert reason in r.error, (name, r.error)
        assert r.reward is None
        assert not r.trainable and all(not any(s.loss_mask) for s in r.samples), name
    assert "boom: the agent crashed" in res["exit_nonzero"].error
    # the calls the crashing harness did make are kept for inspection, masked
    assert res["exit_nonzero"].num_calls == 1 and res["exit_nonzero"].samples
    if runtime == "none":  # the double-forked, setsid daemon was found and killed
        daemon = int(pid_file.read_text())
        assert not alive(daemon)
    else:  # the daemon ran (it wrote its pid in its workspace) and died with the sandbox
        pids = [p.read_text() for p in (tmp_path / "ws").glob("*/daemon.pid")]
        assert pids and all(pids), "the daemon never ran"
        assert not _with_marker(marker), "the sandboxed daemon outlived its session"


def _with_marker(marker: str) -> list[int]:
    """Live processes on the host whose environment holds ``marker``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("POLAR_TEST_MARKER") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def test_timeout_keeps_complete_calls_as_reward_zero(oracle_engine, tmp_path):
    path = tmp_path / "slow_agent.py"
    path.write_text(
        "import asyncio\nfrom openai import AsyncOpenAI\n"
        "async def agent(base_url, task, api_key):\n"
        "    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as c:\n"
        "        await c.chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': task['prompt']}], max_tokens=8)\n"
        "    await asyncio.sleep(600)\n"
    )
    runner = CallableRunner("slow_agent:agent", tmp_path)
    settings = PipelineSettings(agent_timeout_s=10, workspace_root=str(tmp_path / "ws"))
    with LocalStack(oracle_engine, runner, ExactMatch(), settings) as stack:
        (r,), = stack.run_groups([({"prompt": "What is 1 + 2?", "answer": "3"}, 1, {})], timeout_s=300)
    assert r.status == SessionStatus.TIMEOUT and "timed out" in r.error
    assert r.reward == 0.0 and r.num_calls == 1
    assert r.trainable and all(s.reward == 0.0 for s in r.samples)


def test_raising_verifier_marks_error_and_service_survives(oracle_engine, tmp_path):
    (tmp_path / "bad_verifier.py").write_text("def verify(task, output):\n    raise RuntimeError('verifier exploded')\n")
    runner = CommandRunner(python_cmd(str(HERE / "behaviours.py"), "ok"))
    settings = PipelineSettings(agent_timeout_s=120, workspace_root=str(tmp_path / "ws"))
    with LocalStack(oracle_engine, runner, UserFunction("bad_verifier:verify", tmp_path), settings) as stack:
        (r,), = stack.run_groups([({"prompt": "hi", "answer": "x"}, 1, {})], timeout_s=300)
        assert r.status == SessionStatus.ERROR and "verifier exploded" in r.error
        assert not r.trainable and r.num_calls == 1
        # the service is still up and answers
        health = stack.rollout.call(_health(stack))
        assert health["status"] == "ok"


async def _health(stack):
    await asyncio.sleep(0)
    return stack.rollout.service.health()


def test_cpu_limit_kills_a_spinning_harness(tmp_path, no_leftovers):
    from polar.harness.agent.process import run_process

    res = asyncio.run(run_process(python_cmd("-c", "while True: pass"), cwd=str(tmp_path), env=dict(os.environ),
                                  stdin=None, timeout_s=120, limits=ProcessLimits(cpu_time_s=1)))
    assert res.returncode is not None and res.returncode < 0 and not res.timed_out
