"""On-policy distillation through an agent run (``policy.kwargs.teacher``): the student's sessions go through the
harness and the gateway, the embedded-engine teacher scores their sampled tokens in the learner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polar.config import load_config
from polar.errors import ConfigError
from polar.inference import load_engine
from polar.inference.tiny import build_tiny
from polar.metrics.logger import read_metrics
from polar.trainers.build import build_trainer, train_agentic
from polar.trainers.run_dir import RunDir
from tests.agent_support.helpers import HERE, write_jsonl


def _config(tmp_path: Path, teacher: Path) -> Path:
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "prompt": f"Say something {i}."} for i in range(4)])
    path = tmp_path / "run.yaml"
    path.write_text(f"""
name: distill
harness: {{type: agent, callable: "agents_for_tests:one_token", timeout_s: 120}}
tasks: {tmp_path}/tasks.jsonl
eval_tasks: {tmp_path}/tasks.jsonl
verifier: {{type: "agents_for_tests:says_hello"}}
model: {{name_or_path: tiny}}
policy:
  type: grpo
  kwargs: {{group_size: 2, tasks_per_step: 2, total_steps: 2, learning_rate: 1.0e-3, teacher: {{name_or_path: {teacher}}}}}
logging: {{tensorboard: false}}
""")
    sys.path.insert(0, str(HERE))  # the harness/verifier module lives next to these tests
    return path


def _teacher_folder(path: Path, extra_token: bool = False) -> Path:
    """The tiny model's own weights and tokenizer as a local HF folder (with one more token: another tokenizer)."""
    model, tok = build_tiny(0)
    if extra_token:
        tok.add_tokens(["<not-the-students>"])
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_the_teacher_scores_the_sessions_the_student_sampled_through_the_harness(tmp_path):
    cfg = load_config(_config(tmp_path, _teacher_folder(tmp_path / "teacher")))
    cfg._config_dir = HERE
    run_dir = RunDir.create("distill", tmp_path / "run")
    train_agentic(cfg, run_dir, engine=load_engine("tiny"))
    rows = [r for r in read_metrics(run_dir.metrics_path) if "teacher_reverse_kl" in r]
    assert len(rows) == 2 and all(r["sessions_error"] == 0 and r["teacher_tokens"] >= 4 for r in rows)
    assert rows[0]["update_skipped"] == 0  # every group trains: the teacher grades tokens, not the group's rewards
    # the teacher is the student's starting weights: on the first step the engine's recorded logprobs of the
    # sampled tokens and the teacher's forward pass agree, so the reverse KL estimate is 0 up to the kernels
    assert abs(rows[0]["teacher_reverse_kl"]) < 1e-3, rows[0]


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tmp_path):
    cfg = load_config(_config(tmp_path, _teacher_folder(tmp_path / "teacher", extra_token=True)))
    cfg._config_dir = HERE
    with pytest.raises(ConfigError, match=r"policy.kwargs.teacher.name_or_path .*its tokenizer \(\d+ tokens\) is not "
                                          r"the student's \(\d+ tokens\)") as err:
        build_trainer(cfg, RunDir.create("x", tmp_path / "run"), engine=load_engine("tiny"))
    assert "\n" not in str(err.value)
