"""benchmarks/distill_grpo_teacher.py: the student's run mirrors the teacher's grpo_vs_trl.py setup with only the
budget and the teacher changed; the end-to-end smoke (tiny, 2 steps each) is ``slow``. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import distill_grpo_teacher as bench  # noqa: E402
import grpo_vs_trl  # noqa: E402

TASKS = ["--tasks", "benchmarks/grpo_vs_trl_tasks/chain_sum_train.jsonl",
         "--heldout", "benchmarks/grpo_vs_trl_tasks/chain_sum_heldout.jsonl", "--reward", "rewards:last_number"]


def _teacher_json(tmp_path: Path, **polar: object) -> Path:
    teacher_args = grpo_vs_trl.parse([*TASKS, "--json", "t.json", "--steps", "30", "--heldout-limit", "50",
                                      "--max-tokens", "48", "--temperature", "0.8", "--lora-r", "8", "--seed", "5",
                                      "--polar-kwargs", '{"clip_range_high": 0.28}', "--polar-engine", "vllm"])
    path = tmp_path / "teacher.json"
    path.write_text(json.dumps({"polar": {"run_dir": str(tmp_path), "before": {"success": 0.1},
                                          "after": {"success": 0.5}, "wall_s": {"total": 100.0}, **polar},
                                "settings": vars(teacher_args)}))
    return path


def test_the_student_mirrors_the_teachers_setup_with_its_own_budget_and_the_teacher(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    path = _teacher_json(tmp_path)
    args = bench.parse(["--teacher-json", str(path), "--json", str(tmp_path / "s.json"), "--steps", "7",
                        "--group-size", "2"])
    _, settings = bench.teacher_record(path)
    student = bench.student_settings(args, settings, tmp_path / "run")
    assert (student.steps, student.group_size, student.tasks_per_step) == (7, 2, 6)  # the budget is this script's
    # the rest is the teacher's: model, seed, tasks, held-out slice, reward, sampling, LoRA, learning rate
    assert (student.model, student.seed, student.heldout_limit, student.reward) == ("smollm2-135m", 5, 50,
                                                                                    "rewards:last_number")
    assert Path(student.tasks) == ROOT / TASKS[1] and Path(student.heldout) == ROOT / TASKS[3]
    assert (student.max_tokens, student.temperature, student.lora_r, student.learning_rate) == (48, 0.8, 8, 4e-4)
    assert student.polar_engine == "vllm"  # the teacher's engine, so the two wall times compare
    kwargs = json.loads(student.polar_kwargs)
    assert kwargs == {"clip_range_high": 0.28, "teacher": {"name_or_path": str(tmp_path / "run")}}


def test_share_is_the_students_gain_over_the_teachers_and_none_without_a_gain():
    assert bench.share(0.3, 0.4) == pytest.approx(0.75)
    assert bench.share(0.3, 0.0) is None and bench.share(None, 0.4) is None


def test_a_teacher_json_without_a_polar_side_is_refused_in_one_line(tmp_path):
    path = tmp_path / "trl_only.json"
    path.write_text(json.dumps({"trl": {}, "settings": {}}))
    with pytest.raises(SystemExit, match=r"no 'polar' side with a run_dir") as err:
        bench.teacher_record(path)
    assert "\n" not in str(err.value)
    with pytest.raises(SystemExit, match=r"no such file; run benchmarks/grpo_vs_trl.py --only polar first"):
        bench.teacher_record(tmp_path / "missing.json")


@pytest.mark.slow
def test_the_smoke_distils_a_two_step_grpo_run_end_to_end(tmp_path):
    small = ["--model", "tiny", "--heldout-limit", "4", "--tasks-per-step", "2", "--max-tokens", "16", "--threads", "1"]
    teacher = subprocess.run([sys.executable, str(BENCH / "grpo_vs_trl.py"), "--only", "polar", *TASKS, *small,
                              "--steps", "2", "--group-size", "4", "--json", str(tmp_path / "t.json")],
                             capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert teacher.returncode == 0, teacher.stderr[-4000:]
    p = subprocess.run([sys.executable, str(BENCH / "distill_grpo_teacher.py"), "--teacher-json", str(tmp_path / "t.json"),
                        "--steps", "2", "--group-size", "2", "--json", str(tmp_path / "s.json")],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "| student: on-policy distillation |" in p.stdout and "share of the teacher's gain recovered" in p.stdout
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["teacher"]["checkpoint"].endswith("ckpt_00000002.pt")
    metrics = Path(result["student"]["run_dir"]) / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if "teacher_tokens" in line]
    assert len(rows) == 2 and all(r["teacher_tokens"] > 0 for r in rows)  # the teacher graded every step
    assert result["student"]["after"]["sessions"] == 4 and result["wall_ratio"] > 0
