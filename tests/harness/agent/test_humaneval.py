"""HumanEval: the shipped problems, program assembly, pass@k, and hostile completions contained by the
sandbox (no network, no writes outside the workspace, a fork bomb, an infinite loop), each a failed
problem with its reason."""

import asyncio
import socket
import threading

import pytest

from polar.config.llm_agent import HumanEvalTasks
from polar.harness.agent.sandbox import bwrap_unusable
from polar.harness.benchmarks import humaneval
from polar.harness.benchmarks.sources import load_run_tasks

needs_bwrap = pytest.mark.skipif(bwrap_unusable() is not None, reason=f"bubblewrap unusable: {bwrap_unusable()}")


def _task(task_id="HumanEval/0"):
    return next(t for t in load_run_tasks(HumanEvalTasks()) if t["id"] == task_id)


def test_the_164_problems_ship_in_the_package_and_become_tasks():
    tasks = load_run_tasks(HumanEvalTasks(max_tokens=200))
    assert len(tasks) == 164 and tasks[0]["id"] == "HumanEval/0" and tasks[0]["max_tokens"] == 200
    assert "def has_close_elements" in tasks[0]["prompt"] and "```python" in tasks[0]["prompt"]
    assert len(load_run_tasks(HumanEvalTasks(limit=5))) == 5


def test_program_takes_a_whole_function_or_a_body():
    task = _task()
    whole = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    prog = humaneval.program(task, whole)
    assert prog.count("def has_close_elements") == 2 and prog.rstrip().endswith("check(has_close_elements)")
    body = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
    assert humaneval.program(task, body).startswith(task["code_prompt"] + body)


def test_pass_at_k_is_the_unbiased_estimator():
    res = humaneval.pass_at_k({"a": [True, False, False, False], "b": [False] * 4}, ks=(1, 2, 4))
    assert res["pass@1"] == pytest.approx(0.125)
    assert res["pass@2"] == pytest.approx((1 - 3 / 6) / 2)  # 1 - C(3,2)/C(4,2) for a; 0 for b
    assert res["pass@4"] == pytest.approx(0.5)
    assert "pass@10" not in humaneval.pass_at_k({"a": [True]}, ks=(1, 10))


@needs_bwrap
def test_a_correct_completion_passes_and_a_wrong_one_fails(tmp_path):
    task = _task()
    good = ("```python\ndef has_close_elements(numbers, threshold):\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```")
    ok = asyncio.run(humaneval.verify(task, good, tmp_path / "good"))
    assert ok["reward"] == 1.0 and ok["result"] == "passed"
    assert ok["sandbox"] == {"runtime": "bwrap", "network": "none", "user": ok["sandbox"]["user"]}
    bad = asyncio.run(humaneval.verify(task, "    return False\n", tmp_path / "bad"))
    assert bad["reward"] == 0.0 and bad["result"].startswith("failed: AssertionError")


@needs_bwrap
def test_hostile_completions_are_contained_and_recorded(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    reached: list[bytes] = []

    def accept():
        server.settimeout(15)
        try:
            conn, _ = server.accept()
            reached.append(conn.recv(100))
        except OSError:
            pass

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    outside = tmp_path / "outside" / "pwned.txt"
    outside.parent.mkdir()
    fn = "def has_close_elements(numbers, threshold):\n"
    hostile = {
        "network": (f"import socket\n{fn}    s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
                    "    s.sendall(b'leak')\n    return True\n"),
        "write_outside": f"{fn}    open({str(outside)!r}, 'w').write('x')\n    return True\n",
        "fork_bomb": f"import os\n{fn}    while True:\n        os.fork()\n",
        "infinite_loop": f"{fn}    while True:\n        pass\n",
    }
    results = {}
    for name, code in hostile.items():
        results[name] = asyncio.run(humaneval.verify(_task(), f"```python\n{code}```", tmp_path / name,
                                                     timeout_s=5, cpu_time_s=5))
    listener.join(timeout=20)
    server.close()
    assert all(r["reward"] == 0.0 for r in results.values()), results
    assert not reached, "a sandboxed completion reached a host socket"
    assert "ConnectionRefusedError" in results["network"]["result"] or "OSError" in results["network"]["result"]
    assert not outside.exists()
    assert "Error" in results["write_outside"]["result"]  # PermissionError / FileNotFoundError / read-only
    assert results["fork_bomb"]["result"].startswith("failed: BlockingIOError") or "timed out" in results["fork_bomb"]["result"]
    assert results["infinite_loop"]["result"] in ("timed out after 5s", "failed: killed by signal 9") or \
        results["infinite_loop"]["result"].startswith("failed: killed by signal")


def test_train_and_held_out_problem_slices_must_not_overlap():
    from polar.config.base import validate
    from polar.config.run import RunConfig
    from polar.errors import ConfigError

    base = {"harness": {"type": "agent", "callable": "polar.harness.benchmarks.chat:answer"},
            "verifier": {"type": "humaneval"}, "policy": {"type": "grpo"}}
    cfg = validate(RunConfig, {**base, "tasks": {"source": "humaneval", "limit": 100},
                               "eval_tasks": {"source": "humaneval", "start": 100}})
    assert [t["id"] for t in load_run_tasks(cfg.eval_tasks)][:1] == ["HumanEval/100"]
    assert len(load_run_tasks(cfg.eval_tasks)) == 64
    with pytest.raises(ConfigError, match=r"share HumanEval problems 90\.\.99"):
        validate(RunConfig, {**base, "tasks": {"source": "humaneval", "limit": 100},
                             "eval_tasks": {"source": "humaneval", "start": 90}})
