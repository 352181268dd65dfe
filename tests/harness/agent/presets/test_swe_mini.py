"""The swe_mini grader grades the way SWE-bench does: the workspace's patch applied to a clean copy,
the task's tests restored, FAIL_TO_PASS and PASS_TO_PASS run; an empty diff scores 0."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def grader(swe_mini_dir: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("swe_grader", swe_mini_dir / "swe_grader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workspace(task: dict[str, Any], tmp_path: Path) -> Path:
    ws = tmp_path / task["id"]
    shutil.copytree(task["repo"], ws)
    return ws


@pytest.mark.parametrize("task_id", ["median", "slugify", "stack_peek"])
def test_gold_patch_resolves_and_empty_diff_scores_zero(grader: Any, task_id: str, tmp_path: Path) -> None:
    task = {t["id"]: t for t in grader.load_tasks()}[task_id]
    ws = workspace(task, tmp_path)
    empty = grader.grade(task, ws)
    assert empty["reward"] == 0.0 and "empty diff" in empty["reason"]
    gold = (Path(task["repo"]).parent / "gold.patch").read_text()
    subprocess.run(["git", "apply", "-"], cwd=ws, input=gold, text=True, check=True)
    (ws / "__pycache__").mkdir()  # caches and CLI state never count as a change
    (ws / ".claude").mkdir()
    (ws / ".claude" / "state.json").write_text("{}")
    result = grader.grade(task, ws)
    assert result["reward"] == 1.0 and result["resolved"], result
    assert set(result["fail_to_pass"].values()) == {"PASSED"}
    assert ".claude" not in result["patch"]


def test_editing_the_tests_does_not_pass(grader: Any, tmp_path: Path) -> None:
    task = {t["id"]: t for t in grader.load_tasks()}["median"]
    ws = workspace(task, tmp_path)
    (ws / task["test_files"][0]).write_text("def test_median_even():\n    pass\n")
    result = grader.grade(task, ws)
    assert result["reward"] == 0.0 and result["fail_to_pass"]["tests/test_core.py::test_median_even"] == "FAILED"


def test_a_wrong_fix_scores_zero(grader: Any, tmp_path: Path) -> None:
    task = {t["id"]: t for t in grader.load_tasks()}["median"]
    ws = workspace(task, tmp_path)
    core = ws / "stats_lite" / "core.py"
    core.write_text(core.read_text().replace("return values[len(values) // 2]", "return 2.5"))
    result = grader.grade(task, ws)
    assert result["reward"] == 0.0 and not result["resolved"]
    assert result["pass_to_pass"]["tests/test_core.py::test_median_odd"] == "FAILED"


def test_example_config_validates(swe_mini_dir: Path) -> None:
    from polar.config import load_config

    cfg = load_config(swe_mini_dir / "grpo.yaml")
    assert cfg.harness.preset == "pi" and cfg.verifier.type == "swe_grader:grade"
    assert (cfg.config_dir / cfg.tasks).is_file()
