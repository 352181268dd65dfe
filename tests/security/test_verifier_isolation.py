"""Verifiers that execute a workspace run it as the agent ran: bubblewrap, no network, an unprivileged
user, limits, on a copy whose test machinery the task owns (issue 31, "verifiers that execute the
workspace run in the sandbox"). Each test is an attack a model's workspace makes on its grader, with real
bubblewrap processes; each failed on the code before the change (the host was touched or the reward forged)."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from polar.errors import HarnessError
from polar.harness.agent.sandbox import bwrap_unusable
from polar.harness.agent.verifiers import PythonTests, VerifyInput

ROOT = Path(__file__).resolve().parents[2]
SWE_MINI = ROOT / "examples" / "swe_mini"
needs_bwrap = pytest.mark.skipif(bwrap_unusable() is not None, reason=f"bubblewrap unusable: {bwrap_unusable()}")


def verify(verifier: Any, task: dict[str, Any], ws: Path) -> Any:
    return asyncio.run(verifier(VerifyInput(task=task, output="", workspace=ws)))


@pytest.fixture()
def host_paths(tmp_path: Path) -> dict[str, Path]:
    """Host paths a hostile solution aims at: a folder outside its workspace, /root, /etc and /tmp."""
    name = f"polar-verifier-probe-{uuid.uuid4().hex}"
    outside = tmp_path / "outside"
    outside.mkdir()
    paths = {"host_tmp": outside / name, "root": Path("/root") / name, "etc": Path("/etc") / name,
             "tmp": Path("/tmp") / name}
    yield paths
    for p in paths.values():
        if p.exists() or p.is_symlink():
            p.unlink()


# ---- python_tests ----------------------------------------------------------------------------------------


@needs_bwrap
def test_python_tests_solution_cannot_write_outside_its_workspace(tmp_path: Path, host_paths: dict[str, Path]) -> None:
    """A solution that writes to a host folder, /root, /etc and /tmp while its tests run touches none of
    them, nor the session's own workspace (it runs on a copy); its tests still run and pass (the control)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    targets = {k: str(v) for k, v in host_paths.items()}
    (ws / "sol.py").write_text(
        f"for path in {targets!r}.values():\n"
        "    try:\n        open(path, 'w').write('pwned')\n    except OSError:\n        pass\n"
        "open('tampered.txt', 'w').write('x')\n"
        "def add(a, b):\n    return a + b\n")
    verdict = verify(PythonTests(), {"tests": "from sol import add\nassert add(2, 3) == 5\n"}, ws)
    assert verdict.reward == 1.0, verdict.details  # the tests ran, in the sandbox
    landed = [k for k, p in host_paths.items() if p.exists()]
    assert landed == [], f"the solution wrote host paths {landed}"
    assert not (ws / "tampered.txt").exists()  # the copy took the write, not the workspace


@needs_bwrap
def test_python_tests_planted_symlink_is_not_followed_when_the_tests_file_is_written(tmp_path: Path) -> None:
    """The workspace holds ``_polar_tests.py`` (where the tests file used to be written) as a link to a host
    file, and a link to /etc: the host file keeps its content, and the links never reach the sandbox."""
    victim = tmp_path / "host_file.txt"
    victim.write_text("precious host data\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "_polar_tests.py").symlink_to(victim)
    (ws / "etc_link").symlink_to("/etc")
    (ws / "inside_link.py").symlink_to("real.py")  # a link inside the workspace is kept
    (ws / "real.py").write_text("VALUE = 7\n")
    tests = ("import os\nfrom inside_link import VALUE\nassert VALUE == 7\n"
             "assert not os.path.lexists('etc_link')\n")
    verdict = verify(PythonTests(), {"tests": tests}, ws)
    assert victim.read_text() == "precious host data\n", "the verifier wrote through a planted symlink"
    assert verdict.reward == 1.0, verdict.details
    assert any(d.startswith("etc_link") for d in verdict.details["copy"]["dropped_links"]), verdict.details


@needs_bwrap
def test_python_tests_solution_cannot_reach_a_host_loopback_server(tmp_path: Path) -> None:
    """A solution that connects to a server on the host's 127.0.0.1 never reaches it (no network at all)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)
    port = server.getsockname()[1]
    reached: list[bytes] = []

    def accept() -> None:
        try:
            conn, _ = server.accept()
            reached.append(conn.recv(64))
        except OSError:
            pass

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "sol.py").write_text(
        "import socket\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'leak')\n"
        "    RESULT = 'connected'\nexcept OSError as e:\n    RESULT = type(e).__name__\n")
    verdict = verify(PythonTests(), {"tests": "from sol import RESULT\nprint('RESULT', RESULT)\n"}, ws)
    listener.join(timeout=12)
    server.close()
    assert not reached, "the solution reached a host loopback server"
    assert "RESULT connected" not in verdict.details["stdout"], verdict.details


@needs_bwrap
def test_python_tests_code_runs_as_a_non_root_uid(tmp_path: Path) -> None:
    """The verifier's code never runs as root: polar running as root drops it to nobody (65534)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "sol.py").write_text("import os\nUID, GID = os.getuid(), os.getgid()\n")
    verdict = verify(PythonTests(), {"tests": "from sol import UID, GID\nprint('UID', UID, 'GID', GID)\n"}, ws)
    line = next(ln for ln in verdict.details["stdout"].splitlines() if ln.startswith("UID"))
    uid, gid = int(line.split()[1]), int(line.split()[3])
    assert uid != 0 and gid != 0, line
    if os.geteuid() == 0:
        assert (uid, gid) == (65534, 65534), line


@needs_bwrap
@pytest.mark.parametrize("how", ["sys_exit", "os_exit"])
def test_python_tests_solution_that_exits_zero_early_does_not_pass(tmp_path: Path, how: str) -> None:
    """``sys.exit(0)`` / ``os._exit(0)`` in the solution, before the failing assertion, used to be exit 0,
    reward 1; the runner's verdict says the tests did not run to their end."""
    ws = tmp_path / "ws"
    ws.mkdir()
    call = "import sys\nsys.exit(0)\n" if how == "sys_exit" else "import os\nos._exit(0)\n"
    (ws / "sol.py").write_text(f"def add(a, b):\n    return 0\n{call}")
    verdict = verify(PythonTests(), {"tests": "from sol import add\nassert add(2, 3) == 5\n"}, ws)
    assert verdict.reward == 0.0, verdict.details


# ---- swe_grader ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grader() -> Any:
    spec = importlib.util.spec_from_file_location("swe_grader_security", SWE_MINI / "swe_grader.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _median_ws(grader: Any, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    task = {t["id"]: t for t in grader.load_tasks()}["median"]
    ws = tmp_path / "median"
    shutil.copytree(task["repo"], ws)
    return task, ws


FORCE_PASS_HOOK = '''
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
    open({marker!r}, "w").write("hook ran")
'''


def _plant(kind: str, ws: Path, marker: Path, report_hint: str) -> None:
    """Each way an agent can make pytest report passes without fixing the bug (the bug stays)."""
    hook = FORCE_PASS_HOOK.format(marker=str(marker))
    if kind == "conftest":
        (ws / "conftest.py").write_text(hook)
    elif kind == "nested_conftest":
        (ws / "tests" / "conftest.py").write_text(hook)
    elif kind == "pytest_ini_addopts":
        (ws / "forcepass.py").write_text(hook)
        (ws / "pytest.ini").write_text("[pytest]\naddopts = -p forcepass\n")
    elif kind == "pyproject_addopts":
        (ws / "forcepass.py").write_text(hook)
        (ws / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-p forcepass'\n")
    elif kind == "setup_cfg_addopts":
        (ws / "forcepass.py").write_text(hook)
        (ws / "setup.cfg").write_text("[tool:pytest]\naddopts = -p forcepass\n")
    elif kind == "shadow_pytest_module":  # a workspace pytest.py that "runs" the tests and reports success
        (ws / "pytest.py").write_text(
            "import sys\n"
            f"open({str(marker)!r}, 'w').write('shadow ran')\n"
            "def main(args=None, plugins=None):\n    return 0\n"
            "if __name__ == '__main__':\n"
            "    import re\n"
            "    for a in sys.argv:\n"
            "        if a.startswith('--junitxml='):\n"
            "            open(a.split('=', 1)[1], 'w').write('<testsuite>' + ''.join(\n"
            "                '<testcase file=\"tests/test_core.py\" name=\"%s\"/>' % n for n in\n"
            "                ['test_mean', 'test_median_odd', 'test_median_even', 'test_median_empty']) + '</testsuite>')\n"
            "    sys.exit(0)\n")
    elif kind == "forged_report_then_exit":  # package code writes a passing junit report, then ends the process
        (ws / "stats_lite" / "__init__.py").write_text(
            "import os, sys\n"
            f"open({str(marker)!r}, 'w').write('forger ran')\n"
            "cases = ''.join('<testcase file=\"tests/test_core.py\" name=\"%s\"/>' % n for n in\n"
            "                ['test_mean', 'test_median_odd', 'test_median_even', 'test_median_empty'])\n"
            "paths = [a.split('=', 1)[1] for a in sys.argv if a.startswith('--junitxml=')]\n"
            f"paths += [{report_hint!r}]\n"
            "for p in paths:\n"
            "    try:\n        open(p, 'w').write('<testsuite>' + cases + '</testsuite>')\n"
            "    except OSError:\n        pass\n"
            "os._exit(0)\n")
    elif kind == "sitecustomize_and_pth":  # start-up hooks: removed from the copy (inert under -I as well)
        (ws / "sitecustomize.py").write_text(hook)
        (ws / "usercustomize.py").write_text(hook)
        (ws / "zz_force.pth").write_text("import forcepass\n")
        (ws / "forcepass.py").write_text(hook)
    else:
        raise AssertionError(kind)


ATTACKS = ["conftest", "nested_conftest", "pytest_ini_addopts", "pyproject_addopts", "setup_cfg_addopts",
           "shadow_pytest_module", "forged_report_then_exit", "sitecustomize_and_pth"]


@needs_bwrap
@pytest.mark.parametrize("kind", ATTACKS)
def test_swe_grader_forced_pass_hooks_do_not_change_the_reward(grader: Any, tmp_path: Path, kind: str) -> None:
    """The bug stays; the workspace only adds a way to make pytest say "passed". The reward stays 0, the
    fail-to-pass test is not PASSED, and no planted hook ran on the host (its marker file is not there)."""
    task, ws = _median_ws(grader, tmp_path)
    marker = tmp_path / "hook-ran-on-host"
    # where the old grader wrote its junit report, relative to the copy it ran in (tmp/r -> tmp/report.xml)
    _plant(kind, ws, marker, report_hint="../report.xml")
    result = grader.grade(task, ws)
    assert result["reward"] == 0.0 and not result["resolved"], result
    assert result["fail_to_pass"]["tests/test_core.py::test_median_even"] != "PASSED", result
    assert not marker.exists(), f"{kind}: the planted code ran on the host"
    if kind in ("conftest", "nested_conftest", "pytest_ini_addopts", "pyproject_addopts", "setup_cfg_addopts",
                "sitecustomize_and_pth"):
        assert result["removed"], result  # the grader says what it took out of the copy


@needs_bwrap
def test_swe_grader_gold_patch_with_a_planted_conftest_still_resolves(grader: Any, tmp_path: Path) -> None:
    """The control: a real fix next to a planted hook resolves (the hook is dropped, the fix is graded)."""
    task, ws = _median_ws(grader, tmp_path)
    import subprocess

    subprocess.run(["git", "apply", "-"], cwd=ws, input=(Path(task["repo"]).parent / "gold.patch").read_text(),
                   text=True, check=True)
    (ws / "conftest.py").write_text("raise SystemExit('a planted conftest must not load')\n")
    result = grader.grade(task, ws)
    assert result["reward"] == 1.0 and result["resolved"], result
    assert "conftest.py" in result["removed"] and result["isolation"]["network"] == "none", result


@needs_bwrap
def test_swe_grader_symlinked_test_file_does_not_overwrite_a_host_file(grader: Any, tmp_path: Path) -> None:
    """The workspace turns the task's test file into a link to a host file; restoring the tests must not
    write through it (the old grader's ``copy2`` did, as root)."""
    task, ws = _median_ws(grader, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious host data\n")
    test_file = ws / task["test_files"][0]
    test_file.unlink()
    test_file.symlink_to(victim)
    result = grader.grade(task, ws)
    assert victim.read_text() == "precious host data\n", "the grader wrote through a planted link"
    assert result["reward"] == 0.0


@needs_bwrap
def test_swe_grader_tests_cannot_reach_the_host(grader: Any, tmp_path: Path, host_paths: dict[str, Path]) -> None:
    """The package's code runs during the tests: its writes to host paths and its loopback connection
    never land; it runs as a non-root uid."""
    task, ws = _median_ws(grader, tmp_path)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]
    targets = {k: str(v) for k, v in host_paths.items()}
    uid_file = tmp_path / "uid-seen"
    core = ws / "stats_lite" / "core.py"
    core.write_text(core.read_text() + (
        "\nimport os, socket\n"
        f"for _p in {targets!r}.values():\n"
        "    try:\n        open(_p, 'w').write(str(os.getuid()))\n    except OSError:\n        pass\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n"
        "except OSError:\n    pass\n"
        f"try:\n    open({str(uid_file)!r}, 'w').write(str(os.getuid()))\nexcept OSError:\n    pass\n"
        "if os.getuid() == 0:\n    raise RuntimeError('tests ran as root')\n"))
    result = grader.grade(task, ws)
    reached = []
    try:
        conn, _ = server.accept()
        reached.append(conn.recv(16))
    except OSError:
        pass
    finally:
        server.close()
    assert not reached, "the graded code reached a host loopback server"
    assert [k for k, p in host_paths.items() if p.exists()] == [], result
    assert not uid_file.exists(), "the graded code wrote a host file"
    # the tests themselves ran (a real outcome per test, not a crash): the bug fails, the rest pass
    assert result["pass_to_pass"]["tests/test_core.py::test_mean"] == "PASSED", result
    assert result["fail_to_pass"]["tests/test_core.py::test_median_even"] == "FAILED", result


# ---- HumanEval -------------------------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize("escape", ["os_exit_zero", "sys_exit_zero", "write_host_and_exit"])
def test_humaneval_completion_that_escapes_its_check_does_not_pass(tmp_path: Path, escape: str,
                                                                   host_paths: dict[str, Path]) -> None:
    """A completion that ends the program with exit 0 before ``check`` fails it (the classic HumanEval
    hack: exit code 0 was a pass), and its host writes are contained."""
    from polar.config.llm_agent import HumanEvalTasks
    from polar.harness.benchmarks import humaneval
    from polar.harness.benchmarks.sources import load_run_tasks

    task = next(t for t in load_run_tasks(HumanEvalTasks(limit=1)))
    body = {"os_exit_zero": "    import os\n    os._exit(0)\n",
            "sys_exit_zero": "    import sys\n    sys.exit(0)\n",
            "write_host_and_exit": ("    import os\n"
                                    f"    for p in {[str(p) for p in host_paths.values()]!r}:\n"
                                    "        try:\n            open(p, 'w').write('x')\n"
                                    "        except OSError:\n            pass\n    os._exit(0)\n")}[escape]
    code = f"```python\ndef has_close_elements(numbers, threshold):\n{body}```"
    res = asyncio.run(humaneval.verify(task, code, tmp_path / "he", timeout_s=20, cpu_time_s=10))
    assert res["reward"] == 0.0 and not res["passed"], res
    assert [k for k, p in host_paths.items() if p.exists()] == [], res


# ---- no bubblewrap ---------------------------------------------------------------------------------------


def _path_without_bwrap(tmp_path: Path) -> str:
    from tests.harness.agent.presets.test_sandbox_degrade import path_without_bwrap

    return path_without_bwrap(tmp_path)


def test_code_running_verifiers_refuse_without_bwrap_unless_trusted_workspace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, grader: Any) -> None:
    """With no bubblewrap on PATH, python_tests, swe_grader and humaneval refuse to run the workspace's code
    and name the key that allows it; ``trusted_workspace: true`` runs it, and the log says what that means."""
    from polar.config.agentic import VerifierConfig
    from polar.harness.agent.verifiers import build_verifier
    from polar.harness.benchmarks import humaneval

    monkeypatch.setenv("PATH", _path_without_bwrap(tmp_path))
    assert bwrap_unusable() is not None
    with pytest.raises(HarnessError, match="trusted_workspace: true") as e:
        build_verifier(VerifierConfig(type="python_tests"))
    assert "bubblewrap is not installed" in str(e.value)
    task, ws = _median_ws(grader, tmp_path)
    core = ws / "stats_lite" / "core.py"
    core.write_text(core.read_text() + "\n# a change, so there is something to run\n")
    with pytest.raises(HarnessError, match="trusted_workspace: true"):
        grader.grade(task, ws)
    he_task = {"code_prompt": "def f():\n", "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}
    with pytest.raises(HarnessError, match="trusted_workspace: true"):
        asyncio.run(humaneval.verify(he_task, "    return 1\n", tmp_path / "he"))

    from polar.harness.agent import isolation

    monkeypatch.setattr(isolation, "_WARNED", set())  # the log line is said once per verifier and process
    sol = tmp_path / "sol"
    sol.mkdir()
    (sol / "sol.py").write_text("def add(a, b):\n    return a + b\n")
    with caplog.at_level(logging.WARNING):
        trusted = build_verifier(VerifierConfig(type="python_tests", trusted_workspace=True))
        verdict = verify(trusted, {"tests": "from sol import add\nassert add(2, 3) == 5\n"}, sol)
    assert verdict.reward == 1.0 and verdict.details["isolation"]["runtime"] == "none (trusted_workspace)"
    said = [r.getMessage() for r in caplog.records if "trusted_workspace: true" in r.getMessage()]
    assert len(said) == 1 and "runs on this host" in said[0] and "never for a model's output" in said[0], said


# ---- workspace checks ------------------------------------------------------------------------------------


def test_workspace_check_planted_link_or_fifo_fails_the_check_without_reading_the_host(tmp_path: Path) -> None:
    """``workspace`` only reads; a link the agent planted out of the workspace (to a host secret) fails its
    check instead of being read (or raising, which made the session ERROR), and a FIFO does not hang it."""
    from polar.harness.agent.verifiers import WorkspaceCheck

    secret = tmp_path / "host_secret.txt"
    secret.write_text("TOKEN-123\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "answer.txt").symlink_to(secret)
    os.mkfifo(ws / "pipe.txt")
    (ws / "ok.txt").write_text("42\n")
    checks = {"answer.txt": "TOKEN", "pipe.txt": "", "ok.txt": "42"}
    verdict = asyncio.run(asyncio.wait_for(
        WorkspaceCheck(files=checks, strict=False)(VerifyInput(task={}, output="", workspace=ws)), timeout=20))
    assert verdict.details["checks"] == {"answer.txt": False, "pipe.txt": False, "ok.txt": True}, verdict.details


@needs_bwrap
def test_swe_grader_agent_edit_of_the_task_conftest_is_reverted_and_the_fix_still_grades(grader: Any,
                                                                                          tmp_path: Path) -> None:
    """A task whose repository has its own ``conftest.py`` (a fixture the tests need): the agent's patch
    edits it to force passes and also fixes the bug. The patch still applies, the task's conftest is the
    one that runs (its fixture works, the forcing hook is gone), and the real fix is what resolves."""
    task = dict({t["id"]: t for t in grader.load_tasks()}["median"])
    repo = tmp_path / "task-repo"
    shutil.copytree(task["repo"], repo)
    (repo / "conftest.py").write_text("import pytest\n\n@pytest.fixture\ndef answer():\n    return 2.5\n")
    tests = repo / "tests" / "test_core.py"
    tests.write_text(tests.read_text() + "\n\ndef test_fixture_from_task_conftest(answer):\n    assert answer == 2.5\n")
    task.update(repo=str(repo), pass_to_pass=[*task["pass_to_pass"], "tests/test_core.py::test_fixture_from_task_conftest"])
    marker = tmp_path / "hook-ran-on-host"

    def workspace_with(fix: bool) -> Path:
        ws = tmp_path / f"ws-{fix}"
        shutil.copytree(repo, ws)
        (ws / "conftest.py").write_text((ws / "conftest.py").read_text() + FORCE_PASS_HOOK.format(marker=str(marker)))
        if fix:
            import subprocess

            subprocess.run(["git", "apply", "-"], cwd=ws, check=True, text=True,
                           input=(Path(grader.HERE) / "tasks" / "median" / "gold.patch").read_text())
        return ws

    unfixed = grader.grade(task, workspace_with(False))
    assert unfixed["reward"] == 0.0, unfixed
    assert unfixed["fail_to_pass"]["tests/test_core.py::test_median_even"] == "FAILED", unfixed
    fixed = grader.grade(task, workspace_with(True))
    assert fixed["reward"] == 1.0 and fixed["resolved"], fixed
    assert not marker.exists()


@needs_bwrap
def test_swe_grader_symlinked_test_folder_does_not_let_the_restore_write_a_host_folder(grader: Any,
                                                                                        tmp_path: Path) -> None:
    """The workspace turns ``tests/`` into a link to a host folder: restoring the task's test file must not
    create or overwrite a file there (the old grader wrote ``tests/test_core.py`` into it, as root)."""
    task, ws = _median_ws(grader, tmp_path)
    host_dir = tmp_path / "host-folder"
    host_dir.mkdir()
    shutil.rmtree(ws / "tests")
    (ws / "tests").symlink_to(host_dir)
    result = grader.grade(task, ws)
    assert list(host_dir.iterdir()) == [], "the grader wrote into a host folder through a planted link"
    assert result["reward"] == 0.0, result
    assert any(d.startswith("tests") for d in result["dropped_links"]), result


def test_the_copy_is_capped_in_files_and_bytes(tmp_path: Path) -> None:
    """A workspace bloated past the copy's caps is refused (reward 0 with the reason), not copied whole."""
    from polar.harness.agent.isolation import WorkspaceRefused, copy_workspace

    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(5):
        (ws / f"f{i}.txt").write_bytes(b"x" * 1000)
    with pytest.raises(WorkspaceRefused, match="more than 3 files"):
        (tmp_path / "a").mkdir()
        copy_workspace(ws, tmp_path / "a", max_files=3)
    with pytest.raises(WorkspaceRefused, match="more than 0 MiB"):
        (tmp_path / "b").mkdir()
        copy_workspace(ws, tmp_path / "b", max_bytes=2000)
