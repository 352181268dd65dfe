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


def _host_address() -> str | None:
    """A non-loopback IPv4 address of this host (a UDP connect sends nothing), or None."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        addr = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if addr.startswith("127.") else addr


def _processes_mentioning(text: str) -> list[int]:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in p.info["cmdline"] or []):
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


def _probe(body: str) -> str:
    """A completion that runs ``body`` (which sets ``facts``) and fails with them in its error message."""
    indented = "".join(f"    {line}\n" for line in body.strip().splitlines())
    return (f"```python\nimport os, socket, subprocess, sys, time\n"
            f"def has_close_elements(numbers, threshold):\n    facts = {{}}\n{indented}"
            f"    raise RuntimeError('FACTS=' + repr(sorted(facts.items())))\n```")


def _facts(result: dict) -> dict:
    import ast

    line = result["result"]
    assert "FACTS=" in line, result
    return dict(ast.literal_eval(line.split("FACTS=", 1)[1]))


@needs_bwrap
def test_a_completion_sees_no_network_but_loopback_and_reaches_no_host_address(tmp_path):
    """Inside the sandbox only `lo` exists: neither the host's loopback listener nor one on the host's own
    non-loopback address (listening on all interfaces) is reachable, and names do not resolve."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    host = _host_address()
    targets = ["127.0.0.1", *([host] if host else [])]
    body = f"""
facts['ifaces'] = sorted(name for _, name in socket.if_nameindex())
for addr in {targets!r}:
    try:
        socket.create_connection((addr, {port}), timeout=2).sendall(b'leak')
        facts[addr] = 'connected'
    except OSError as e:
        facts[addr] = type(e).__name__
try:
    socket.getaddrinfo('pypi.org', 443)
    facts['dns'] = 'resolved'
except OSError as e:
    facts['dns'] = type(e).__name__
"""
    res = asyncio.run(humaneval.verify(_task(), _probe(body), tmp_path / "net", timeout_s=20, cpu_time_s=10))
    reached = []
    try:
        while True:
            conn, _ = server.accept()
            reached.append(conn.recv(16))
    except OSError:
        pass
    finally:
        server.close()
    facts = _facts(res)
    assert res["reward"] == 0.0 and not reached, (facts, reached)
    assert facts["ifaces"] == ["lo"], facts
    assert all(facts[a] in ("ConnectionRefusedError", "OSError", "TimeoutError") for a in targets), facts
    assert facts["dns"] == "gaierror", facts


@needs_bwrap
def test_a_completion_cannot_touch_the_host_filesystem_outside_its_workspace(tmp_path):
    """Writes to a host folder, the host's home, the repository, /tmp, /etc and /usr never land on the host;
    a host file outside the workspace cannot be read; the workspace itself is writable (the control)."""
    import uuid
    from pathlib import Path

    name = f"polar-sandbox-probe-{uuid.uuid4().hex}"
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("host secret")
    repo = Path(__file__).resolve().parents[3]
    targets = {"host_dir": outside / name, "home": Path.home() / name, "repo": repo / name,
               "tmp": Path("/tmp") / name, "etc": Path("/etc") / name, "usr": Path("/usr") / name}
    body = f"""
for key, path in {({k: str(v) for k, v in targets.items()})!r}.items():
    try:
        with open(path, 'w') as f:
            f.write('x')
        facts[key] = 'wrote'
    except OSError as e:
        facts[key] = type(e).__name__
try:
    facts['read_secret'] = open({str(secret)!r}).read()
except OSError as e:
    facts['read_secret'] = type(e).__name__
open('inside.txt', 'w').write('ok')
facts['workspace'] = open('inside.txt').read()
"""
    try:
        res = asyncio.run(humaneval.verify(_task(), _probe(body), tmp_path / "fs", timeout_s=20, cpu_time_s=10))
        facts = _facts(res)
        landed = [k for k, p in targets.items() if p.exists()]
    finally:
        for p in targets.values():
            if p.exists():
                p.unlink()
    assert res["reward"] == 0.0 and not landed, (landed, facts)
    assert facts["workspace"] == "ok", facts  # the sandbox runs, and writes where it may
    assert facts["read_secret"] in ("FileNotFoundError", "PermissionError"), facts
    # host folders are not there at all, or read-only; the sandbox's own /tmp is a throwaway tmpfs
    for key in ("host_dir", "home", "repo", "etc", "usr"):
        assert facts[key] in ("FileNotFoundError", "PermissionError", "OSError"), (key, facts)


@needs_bwrap
def test_a_fork_bomb_is_capped_and_leaves_no_process_behind(tmp_path):
    import time

    ws = tmp_path / "bomb"
    code = ("```python\nimport os\ndef has_close_elements(numbers, threshold):\n"
            "    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n```")
    t0 = time.monotonic()
    res = asyncio.run(humaneval.verify(_task(), code, ws, timeout_s=5, cpu_time_s=5, max_processes=32))
    took = time.monotonic() - t0
    assert res["reward"] == 0.0 and not res["passed"]
    assert res["timed_out"] or res["result"].startswith("failed"), res
    assert took < 5 + 30, took  # the wall-clock limit holds while the bomb runs
    assert res["leftover_processes"] == 0 or not _processes_mentioning(res["folder"]), res
    time.sleep(0.5)
    assert _processes_mentioning(res["folder"]) == [], "fork-bomb processes outlived their verification"
    import subprocess

    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


@needs_bwrap
def test_infinite_loops_and_hidden_sleepers_end_at_the_limits(tmp_path):
    """A busy loop is stopped by the CPU or wall-clock limit, a sleeping one (no CPU used) by the wall
    clock, and a daemon that double-forks into its own session is killed with the sandbox."""
    import time

    fn = "def has_close_elements(numbers, threshold):\n"
    cases = {
        # the CPU limit (1 s) far below the wall clock, which a niced process on a loaded box also needs
        "busy": (f"```python\n{fn}    while True:\n        pass\n```", 120, 1),
        "sleeping": (f"```python\nimport time\n{fn}    time.sleep(10 ** 6)\n```", 3, 10),
        "daemon": (f"```python\nimport os, time\n{fn}    if os.fork() == 0:\n        os.setsid()\n"
                   "        if os.fork() == 0:\n            time.sleep(10 ** 6)\n        os._exit(0)\n"
                   "    return True\n```", 4, 4),
    }
    for name, (code, wall, cpu) in cases.items():
        ws = tmp_path / name
        t0 = time.monotonic()
        res = asyncio.run(humaneval.verify(_task(), code, ws, timeout_s=wall, cpu_time_s=cpu))
        took = time.monotonic() - t0
        assert res["reward"] == 0.0, (name, res)
        assert took < wall + 20, (name, took)
        time.sleep(0.5)
        assert _processes_mentioning(res["folder"]) == [], f"{name}: a process outlived its verification"
        if name == "busy":  # RLIMIT_CPU (SIGXCPU, then SIGKILL) before the wall clock
            assert not res["timed_out"] and res["result"].startswith("failed: killed by signal 24 (SIGXCPU"), res
        if name == "sleeping":
            assert res["timed_out"] and res["result"] == "timed out after 3s", res


def test_a_forking_completions_interleaved_tracebacks_still_report_its_exception():
    """A fork bomb's children write their tracebacks at once; the result names the exception, not whichever
    frame line happened to be written last (seen under load: 'failed:   File "<frozen runpy>", ...')."""
    err = ("Traceback (most recent call last):\n  File \"solution.py\", line 3, in <module>\n"
           "BlockingIOError: [Errno 11] Resource temporarily unavailable\nTraceback (most recent call last):\n"
           "  File \"<frozen runpy>\", line 291, in run_path\n")
    assert humaneval._exception_line(err) == "BlockingIOError: [Errno 11] Resource temporarily unavailable"
    assert humaneval._exception_line("plain last line\n") == "plain last line"
    assert humaneval._exception_line("") == ""
    glued = "Traceback (most recent call last):\n    os.fork()BlockingIOError: [Errno 11] again\n    os.fork()\n"
    assert humaneval._exception_line(glued) == "BlockingIOError: [Errno 11] again"
