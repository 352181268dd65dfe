"""SWE-bench-style grading for the swe_mini tasks.

The session's change is taken as a patch (workspace against the task's clean repository, CLI state and
caches left out), applied to a fresh clean copy, the task's test files and every file that decides how
tests run (``conftest.py``, ``pytest.ini``, ``pyproject.toml``, ``sitecustomize.py``, ``*.pth``, ...)
are restored from the clean repository or removed (an agent cannot pass by editing tests or hooking
pytest), and the FAIL_TO_PASS and PASS_TO_PASS tests run in polar's verifier sandbox (bubblewrap, no
network, ``nobody``, limits; :mod:`polar.harness.agent.isolation`). Reward 1.0 only when every one of
them passes and pytest's own run ended cleanly ("resolved"); an empty patch scores 0 without running.

Use as ``verifier: {type: "swe_grader:grade"}`` next to ``tasks.jsonl``, or call :func:`grade`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from polar.harness.agent.isolation import (
    CopyReport,
    VerifySandbox,
    WorkspaceRefused,
    chown_tree,
    copy_workspace,
    restore_from_task,
    run_pytest,
    sanitize,
)

HERE = Path(__file__).resolve().parent
NOISE = (".git", ".claude", ".codex", ".qwen", ".gemini", ".pi", ".opencode", "node_modules", ".venv",
         "__pycache__", ".pytest_cache", "*.pyc")
TEST_TIMEOUT_S = 120.0


def load_tasks(path: str | Path = HERE / "tasks.jsonl") -> list[dict[str, Any]]:
    """The tasks, with ``repo`` made absolute."""
    path = Path(path)
    tasks = []
    for line in path.read_text().splitlines():
        if line.strip():
            task = json.loads(line)
            task["repo"] = str((path.parent / task["repo"]).resolve())
            tasks.append(task)
    return tasks


def _repo(task: dict[str, Any], tasks_root: str | Path | None) -> Path:
    repo = Path(task["repo"])
    if not repo.is_absolute():
        repo = Path(tasks_root or HERE) / repo
    if not repo.is_dir():
        raise FileNotFoundError(f"task {task.get('id')!r}: repository {repo} does not exist")
    return repo


def _git(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "-c", "user.name=grader", "-c", "user.email=grader@localhost",
         "-c", "core.hooksPath=/dev/null", *args],
        cwd=cwd, capture_output=True, text=True, input=stdin, timeout=60,
    )


def make_patch(repo: Path, workspace: Path, report: CopyReport | None = None) -> str:
    """``git diff`` of ``workspace`` against ``repo`` (binary-safe), ignoring CLI state and caches.

    The workspace is copied without following links (a link out of it is dropped, a FIFO skipped), so
    reading it never reaches a host file the agent pointed at."""
    with tempfile.TemporaryDirectory(prefix="swe-diff-") as tmp:
        d = Path(tmp) / "r"
        shutil.copytree(repo, d, ignore=shutil.ignore_patterns(*NOISE))
        _git(d, "init", "-q")
        _git(d, "add", "-A")
        _git(d, "commit", "-q", "--allow-empty", "-m", "clean")
        for child in d.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        # the diff shows a planted conftest.py (grading drops it); links out of the workspace never enter it
        copy_workspace(workspace, d, keep_task_owned=True, report=report)
        _git(d, "add", "-A")
        res = _git(d, "diff", "--cached", "--binary", "HEAD")
        if res.returncode != 0:
            raise RuntimeError(f"git diff failed: {res.stderr.strip()}")
        return res.stdout


async def run_tests(task: dict[str, Any], repo: Path, patch: str, trusted_workspace: bool = False,
                    timeout_s: float = TEST_TIMEOUT_S) -> dict[str, Any]:
    """Apply ``patch`` to a clean copy, restore the task's tests and every file it owns (``conftest.py``,
    ``pytest.ini``, ``pyproject.toml``, ...), drop links that leave the copy, and run the tests in polar's
    verifier sandbox (:class:`polar.harness.agent.isolation.VerifySandbox`); per-test outcomes."""
    tests = [*task.get("fail_to_pass", []), *task.get("pass_to_pass", [])]
    with VerifySandbox("swe_grader", trusted_workspace=trusted_workspace, timeout_s=timeout_s,
                       cpu_time_s=int(timeout_s), memory_mb=2048) as box:
        box.copy_in(repo, keep_task_owned=True)  # the task's clean repository, whole, for the patch
        if patch.strip():
            res = _git(box.work, "apply", "--whitespace=nowarn", "-", stdin=patch)
            if res.returncode != 0:
                return {"applied": False, "apply_error": res.stderr.strip()[-500:], "tests": {}}
        sanitize(box.work, box.report)
        restore_from_task(box.work, repo, task.get("test_files", []), owner=box.uid)
        if box.uid is not None:
            chown_tree(box.work, box.uid)  # what git apply wrote, for the sandbox user
        result = await run_pytest(box, tests)
    return {"applied": True, "tests": result.outcomes, "all_passed": result.all_passed, "why": result.why,
            "removed": box.report.removed, "dropped_links": box.report.dropped_links,
            "isolation": box.isolation, "log": (result.run.details()["stdout"] + result.run.details()["stderr"])[-2000:]}


def grade(task: dict[str, Any], workspace: str | Path, tasks_root: str | Path | None = None,
          harness: dict[str, Any] | None = None, trusted_workspace: bool = False,
          timeout_s: float = TEST_TIMEOUT_S) -> dict[str, Any]:
    """Reward for one finished session: 1.0 if the workspace's patch resolves the task, else 0.0.

    ``harness`` is what the runner collected (for presets: the CLI, its transcript, its last lines);
    it does not change the reward, it is kept with the verdict for inspection. ``trusted_workspace`` is
    the verifier config's key: without bubblewrap the tests run only when it is true.
    """
    repo = _repo(task, tasks_root)
    copied = CopyReport()
    try:
        patch = make_patch(repo, Path(workspace), copied)
    except WorkspaceRefused as e:  # too large or too many files to grade: the session's doing, reward 0
        return {"reward": 0.0, "resolved": False, "reason": f"workspace refused: {e}", "patch": ""}
    seen = {}
    if harness:
        seen = {"cli": harness.get("cli"), "transcript_events": len(harness.get("transcript") or []),
                "transcript_files": sorted(harness.get("transcript_files") or {})}
    if not patch.strip():
        return {"reward": 0.0, "resolved": False, "reason": "empty diff: the session changed nothing", "patch": "", **seen}
    result = asyncio.run(run_tests(task, repo, patch, trusted_workspace, timeout_s))
    f2p = {t: result["tests"].get(t, "MISSING") for t in task.get("fail_to_pass", [])}
    p2p = {t: result["tests"].get(t, "MISSING") for t in task.get("pass_to_pass", [])}
    resolved = bool(result["applied"] and result["all_passed"]
                    and all(s == "PASSED" for s in [*f2p.values(), *p2p.values()]))
    out = {
        "reward": 1.0 if resolved else 0.0,
        "resolved": resolved,
        "fail_to_pass": f2p,
        "pass_to_pass": p2p,
        "patch": patch[:20000],
        **seen,
    }
    if not result["applied"]:
        out["reason"] = f"patch did not apply: {result.get('apply_error', '')}"
    else:
        out.update(isolation=result["isolation"], removed=result["removed"],
                   dropped_links=[*copied.dropped_links, *result["dropped_links"]])
        if not resolved:
            out.update(log=result.get("log", ""), reason=result.get("why") or "a test did not pass")
    return out
