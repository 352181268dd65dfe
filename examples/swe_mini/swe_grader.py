"""SWE-bench-style grading for the swe_mini tasks.

The session's change is taken as a patch (workspace against the task's clean repository, CLI state and
caches left out), applied to a fresh clean copy, the task's test files are restored from the clean
repository (an agent cannot pass by editing tests), and the FAIL_TO_PASS and PASS_TO_PASS tests run.
Reward 1.0 only when every one of them passes ("resolved"); an empty patch scores 0 without running.

Use as ``verifier: {type: "swe_grader:grade"}`` next to ``tasks.jsonl``, or call :func:`grade`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

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


def make_patch(repo: Path, workspace: Path) -> str:
    """``git diff`` of ``workspace`` against ``repo`` (binary-safe), ignoring CLI state and caches."""
    with tempfile.TemporaryDirectory(prefix="swe-diff-") as tmp:
        d = Path(tmp) / "r"
        shutil.copytree(repo, d, ignore=shutil.ignore_patterns(*NOISE))
        _git(d, "init", "-q")
        _git(d, "add", "-A")
        _git(d, "commit", "-q", "--allow-empty", "-m", "clean")
        for child in d.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        shutil.copytree(workspace, d, dirs_exist_ok=True, symlinks=True, ignore=shutil.ignore_patterns(*NOISE))
        _git(d, "add", "-A")
        res = _git(d, "diff", "--cached", "--binary", "HEAD")
        if res.returncode != 0:
            raise RuntimeError(f"git diff failed: {res.stderr.strip()}")
        return res.stdout


def run_tests(task: dict[str, Any], repo: Path, patch: str) -> dict[str, Any]:
    """Apply ``patch`` to a clean copy, restore the task's tests, run them; per-test outcomes."""
    tests = [*task.get("fail_to_pass", []), *task.get("pass_to_pass", [])]
    with tempfile.TemporaryDirectory(prefix="swe-eval-") as tmp:
        d = Path(tmp) / "r"
        shutil.copytree(repo, d, ignore=shutil.ignore_patterns(*NOISE))
        if patch.strip():
            res = _git(d, "apply", "--whitespace=nowarn", "-", stdin=patch)
            if res.returncode != 0:
                return {"applied": False, "apply_error": res.stderr.strip()[-500:], "tests": {}}
        for rel in task.get("test_files", []):
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, d / rel)
        report = Path(tmp) / "report.xml"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1", "HOME": tmp}
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *tests],
                cwd=d, capture_output=True, text=True, timeout=TEST_TIMEOUT_S, env=env,
            )
            log_tail = (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            return {"applied": True, "tests": {t: "TIMEOUT" for t in tests}, "log": f"tests ran past {TEST_TIMEOUT_S}s"}
        outcomes = {t: "MISSING" for t in tests}
        if report.is_file():
            for case in ET.parse(report).getroot().iter("testcase"):
                file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
                test_id = f"{file}::{case.get('name')}"
                status = "PASSED"
                for child in case:
                    if child.tag in ("failure", "error"):
                        status = "FAILED"
                    elif child.tag == "skipped":
                        status = "SKIPPED"
                if test_id in outcomes:
                    outcomes[test_id] = status
        return {"applied": True, "tests": outcomes, "log": log_tail}


def grade(task: dict[str, Any], workspace: str | Path, tasks_root: str | Path | None = None,
          harness: dict[str, Any] | None = None) -> dict[str, Any]:
    """Reward for one finished session: 1.0 if the workspace's patch resolves the task, else 0.0.

    ``harness`` is what the runner collected (for presets: the CLI, its transcript, its last lines);
    it does not change the reward, it is kept with the verdict for inspection.
    """
    repo = _repo(task, tasks_root)
    patch = make_patch(repo, Path(workspace))
    seen = {}
    if harness:
        seen = {"cli": harness.get("cli"), "transcript_events": len(harness.get("transcript") or []),
                "transcript_files": sorted(harness.get("transcript_files") or {})}
    if not patch.strip():
        return {"reward": 0.0, "resolved": False, "reason": "empty diff: the session changed nothing", "patch": "", **seen}
    result = run_tests(task, repo, patch)
    f2p = {t: result["tests"].get(t, "MISSING") for t in task.get("fail_to_pass", [])}
    p2p = {t: result["tests"].get(t, "MISSING") for t in task.get("pass_to_pass", [])}
    resolved = result["applied"] and all(s == "PASSED" for s in [*f2p.values(), *p2p.values()])
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
    elif not resolved:
        out["log"] = result.get("log", "")
    return out
