"""On-policy distillation of a GRPO-trained model into its untrained base (issue 37, item 3): how much of the
teacher's held-out gain the student recovers, and in how much wall time against the GRPO run that made the teacher.

    # the teacher: polar's GRPO side of benchmarks/grpo_vs_trl.py (its JSON records before/after and wall_s)
    nice .venv/bin/python benchmarks/grpo_vs_trl.py --only polar \\
        --tasks benchmarks/grpo_vs_trl_tasks/chain_sum_train.jsonl \\
        --heldout benchmarks/grpo_vs_trl_tasks/chain_sum_heldout.jsonl --reward rewards:last_number \\
        --steps 30 --json runs/grpo_vs_trl/chain_sum.json
    # the student: the same untrained model, distilled from that run's latest checkpoint
    nice .venv/bin/python benchmarks/distill_grpo_teacher.py --teacher-json runs/grpo_vs_trl/chain_sum.json \\
        --steps 10 --json runs/distill_grpo_teacher/chain_sum.json

- **Teacher**: the GRPO run folder the JSON names (``polar.run_dir``; ``--teacher`` gives another folder or a
  checkpoint file), loaded as ``policy.kwargs.teacher.name_or_path``: its own base model with the checkpoint's
  LoRA merged. Its held-out success before and after, and its wall time (``polar.wall_s.total``: model load,
  both evaluations and every step), are read from the JSON, not re-measured.
- **Student**: the same run as ``grpo_vs_trl.py``'s ``run_polar`` builds (``--model``, seed, tasks, harness
  ``polar.harness.benchmarks.chat:answer``, verifier ``_grpo_vs_trl_verify:verify`` with the same ``--reward``,
  the same first ``--heldout-limit`` held-out tasks, ``max_tokens``, temperature, LoRA, learning rate, clip, no KL:
  all from the JSON's ``settings``), with ``teacher`` set: each sampled token's advantage is
  ``log p_teacher - log p_student`` instead of the group's reward (docs/llm-roles.md, "Distillation").
- **Budget** (the student's, on the command line): ``--steps`` optimizer steps of ``--tasks-per-step`` x
  ``--group-size`` sessions. A teacher grades every token, so a group needs no second sample: the default (4 x 6 = 24
  sessions a step) is half of GRPO's 48.
- **Share of the gain recovered**: ``(student after - student before) / (teacher after - teacher before)``, each
  gain against its own run's "before" (the same untrained model, sampled again); the table also gives it against
  the teacher's "before".

"wall s (total)" is each run's whole ``train_agentic`` (model and teacher load, the held-out evaluation before and
after, every step); "of which training" is the time between the two evaluations' ends (the steps and the "after"
evaluation). Prints one markdown table and writes ``--json``: ``{"teacher": {...}, "student": {...}, "share_recovered",
"wall_ratio", "settings"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import grpo_vs_trl  # noqa: E402  (benchmarks/ is not a package: its sibling script, for the same task setup)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher-json", required=True, help="grpo_vs_trl.py's --json of the teacher's run (polar side)")
    p.add_argument("--teacher", default=None, help="the teacher run folder or checkpoint (default: the JSON's "
                                                  "polar.run_dir)")
    p.add_argument("--json", required=True, help="where the results go")
    p.add_argument("--steps", type=int, default=10, help="the student's optimizer steps")
    p.add_argument("--group-size", type=int, default=4, help="sessions per task in a step")
    p.add_argument("--tasks-per-step", type=int, default=None, help="tasks per step (default: the teacher's)")
    p.add_argument("--learning-rate", type=float, default=None, help="default: the teacher's")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the teacher's)")
    p.add_argument("--polar-kwargs", default="{}", help="JSON merged into the student's policy.kwargs")
    p.add_argument("--work-dir", default=None, help="run folder (default: next to --json)")
    return p.parse_args(argv)


def teacher_record(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(polar side, settings) of a grpo_vs_trl.py JSON; exits in one line when it has no polar side."""
    if not path.is_file():
        raise SystemExit(f"--teacher-json {path}: no such file; run benchmarks/grpo_vs_trl.py --only polar first")
    data = json.loads(path.read_text())
    polar, settings = data.get("polar"), data.get("settings")
    if not isinstance(polar, dict) or not isinstance(settings, dict) or "run_dir" not in polar:
        raise SystemExit(f"--teacher-json {path}: no 'polar' side with a run_dir (and 'settings'); it must be a "
                         "benchmarks/grpo_vs_trl.py result with the polar side run")
    return polar, settings


def resolve(recorded: str, json_path: Path) -> Path:
    """A path the teacher's JSON recorded, relative to the folder grpo_vs_trl.py ran in: this one, or the first
    folder above the JSON where it exists (the JSON may be read from another checkout)."""
    path = Path(recorded)
    if path.is_absolute() or path.exists():
        return path.resolve()
    for folder in json_path.resolve().parents:
        if (folder / path).exists():
            return folder / path
    raise SystemExit(f"{json_path} names {recorded}, which is not here nor above it; give --teacher")


def student_settings(args: argparse.Namespace, settings: dict[str, Any], teacher: Path) -> argparse.Namespace:
    """``grpo_vs_trl.parse``'s namespace for the student: the teacher's task setup, this script's budget, and
    the teacher in ``--polar-kwargs``."""
    src = Path(args.teacher_json)
    kwargs = {**json.loads(settings.get("polar_kwargs") or "{}"), **json.loads(args.polar_kwargs),
              "teacher": {"name_or_path": str(teacher)}}
    argv = ["--tasks", str(resolve(settings["tasks"], src)), "--heldout", str(resolve(settings["heldout"], src)),
            "--reward", settings["reward"],
            "--json", args.json, "--steps", str(args.steps), "--heldout-limit", str(settings["heldout_limit"]),
            "--group-size", str(args.group_size),
            "--tasks-per-step", str(args.tasks_per_step or settings["tasks_per_step"]),
            "--learning-rate", str(args.learning_rate or settings["learning_rate"]),
            "--lora-r", str(settings["lora_r"]), "--lora-alpha", str(settings["lora_alpha"]),
            "--max-tokens", str(settings["max_tokens"]), "--temperature", str(settings["temperature"]),
            "--model", str(settings["model"]), "--seed", str(settings["seed"]),
            "--threads", str(args.threads or settings["threads"]), "--polar-kwargs", json.dumps(kwargs),
            "--polar-engine", str(settings.get("polar_engine", "embedded"))]
    return grpo_vs_trl.parse(argv)


def gain(side: dict[str, Any]) -> float | None:
    before, after = side.get("before", {}).get("success"), side.get("after", {}).get("success")
    return None if before is None or after is None else float(after) - float(before)


def share(student_gain: float | None, teacher_gain: float | None) -> float | None:
    """The student's gain over the teacher's; None when the teacher gained nothing (there is no gain to recover)."""
    if student_gain is None or teacher_gain is None or teacher_gain <= 0:
        return None
    return student_gain / teacher_gain


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.0f}%" if pct else f"{x:.3f}"


def table(result: dict[str, Any]) -> str:
    t, s = result["teacher"], result["student"]
    head = "| run | held-out before | after | gain | steps | sessions | wall s (total) | of which training s |"
    rows = [head, "|---|---|---|---|---|---|---|---|"]
    for name, r in (("teacher: GRPO", t), ("student: on-policy distillation", s)):
        w = r["wall_s"]
        training = round(w["after"] - w["before"], 1) if w.get("after") and w.get("before") else None
        rows.append(f"| {name} | {_f(r['before'].get('success'))} | {_f(r['after'].get('success'))} | {_f(gain(r))} "
                    f"| {r.get('steps')} | {r.get('sessions')} | {w.get('total')} | {training} |")
    rows.append("")
    rows.append(f"share of the teacher's gain recovered: {_f(result['share_recovered'], pct=True)} "
                f"(against the teacher's 'before': {_f(result['share_recovered_vs_teacher_before'], pct=True)}); "
                f"wall time, distillation / GRPO: {_f(result['wall_ratio'])}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    teacher_side, settings = teacher_record(Path(args.teacher_json))
    teacher = Path(args.teacher).resolve() if args.teacher else resolve(teacher_side["run_dir"], Path(args.teacher_json))
    if not teacher.exists():
        raise SystemExit(f"--teacher {teacher}: no such run folder or checkpoint")
    checkpoint = teacher
    if teacher.is_dir():
        from polar.trainers.checkpoint import CheckpointManager

        latest = CheckpointManager(teacher / "checkpoints").latest()
        if latest is None:
            raise SystemExit(f"--teacher {teacher}: the run has no checkpoint")
        checkpoint = latest
    student_args = student_settings(args, settings, teacher)
    os.environ.setdefault("OMP_NUM_THREADS", str(student_args.threads))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir) if args.work_dir else out.parent / (out.stem + "_runs")
    work.mkdir(parents=True, exist_ok=True)
    heldout = grpo_vs_trl._limited_heldout(student_args, work)  # the same first N held-out tasks as the teacher's
    t0, load_before = time.monotonic(), os.getloadavg()
    print(f"teacher: {checkpoint} ({teacher_side.get('steps')} GRPO steps); student: {student_args.steps} steps of "
          f"{student_args.tasks_per_step} x {student_args.group_size} sessions", flush=True)
    student = grpo_vs_trl.run_polar(student_args, work, heldout)
    student["framework"] = "polar distill"
    teacher_gain, student_gain = gain(teacher_side), gain(student)
    vs_teacher_before = None
    if student.get("after", {}).get("success") is not None and teacher_side.get("before", {}).get("success") is not None:
        vs_teacher_before = float(student["after"]["success"]) - float(teacher_side["before"]["success"])
    grpo_wall, distill_wall = teacher_side.get("wall_s", {}).get("total"), student["wall_s"]["total"]
    result = {"teacher": {**teacher_side, "checkpoint": str(checkpoint)}, "student": student,
              "share_recovered": share(student_gain, teacher_gain),
              "share_recovered_vs_teacher_before": share(vs_teacher_before, teacher_gain),
              "wall_ratio": distill_wall / grpo_wall if grpo_wall else None,
              "settings": {**vars(args), "student": vars(student_args), "load_before": load_before, "load_after": os.getloadavg(),
                           "script_s": round(time.monotonic() - t0, 1)}}
    out.write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
