"""On-policy distillation through an agent run (``policy.kwargs.teacher``): the student's sessions go through the
harness and the gateway, the embedded-engine teacher scores their sampled tokens in the learner."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from polar.config import load_config
from polar.config.base import validate
from polar.config.grpo import LoraConfig, TeacherConfig
from polar.config.run import RunConfig
from polar.errors import ConfigError
from polar.inference import load_engine
from polar.inference.tiny import build_tiny
from polar.metrics.logger import read_metrics
from polar.models.llm_policy import LLMPolicy
from polar.trainers.build import build_trainer, train_agentic
from polar.trainers.checkpoint import CheckpointManager, load_checkpoint
from polar.trainers.registry import llm_teacher
from polar.trainers.run_dir import RunDir
from polar.types import TrajectorySample
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


# ------------------------------------------------------------------ a polar GRPO run as the teacher
@pytest.fixture(scope="module")
def grpo_teacher_run(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    """Two GRPO steps of LoRA r4 on tiny (seed 3: the base model a teacher must rebuild is seed 3's), rewarded for
    an even first token at a high learning rate, so the adapters move far from their zero start."""
    tmp_path = tmp_path_factory.mktemp("grpo_teacher")
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "prompt": f"Say something {i}."} for i in range(4)])
    cfg = validate(RunConfig, {
        "name": "teacher", "seed": 3,
        "harness": {"type": "agent", "callable": "agents_for_tests:one_token", "timeout_s": 120},
        "tasks": str(tmp_path / "tasks.jsonl"), "verifier": {"type": "agents_for_tests:even_token"},
        "model": {"name_or_path": "tiny"},
        "policy": {"type": "grpo", "kwargs": {"group_size": 4, "tasks_per_step": 2, "total_steps": 2,
                                              "learning_rate": 5.0e-2, "lora": {"r": 4, "alpha": 8},
                                              "dynamic_sampling": {"max_extra_rounds": 3}}},
        "logging": {"tensorboard": False, "progress_bar": False},
    })
    cfg._config_dir = HERE
    sys.path.insert(0, str(HERE))
    run_dir = RunDir.create("teacher", tmp_path / "teacher_run")
    train_agentic(cfg, run_dir, engine=load_engine("tiny", seed=3))
    return run_dir


def _student() -> LLMPolicy:
    model, tok = build_tiny(0)
    return LLMPolicy(model, tok)


def _logprobs(policy: LLMPolicy, model: torch.nn.Module | None = None) -> torch.Tensor:
    seqs = [[5, 9, 11, 13, 21, 40, 41, 77], [3, 100, 7, 250, 251, 252, 9, 1]]
    batch = policy.collate([TrajectorySample(session_id=f"s{i}", token_ids=s, loss_mask=[0, 0] + [1] * (len(s) - 2),
                                             logprobs=[0.0] * len(s), policy_versions=[0] * len(s),
                                             call_indices=[0] * len(s)) for i, s in enumerate(seqs)])
    with torch.no_grad():
        return policy.token_logprobs(batch, model)


def test_a_grpo_checkpoint_is_the_teacher_on_its_own_base_model_with_its_lora_merged(grpo_teacher_run, tmp_path):
    run_dir = grpo_teacher_run
    ckpt = CheckpointManager(run_dir.checkpoints_dir).latest()
    assert ckpt is not None
    # the checkpoint's policy as the run trained it: seed 3's tiny with the LoRA adapters on
    model, tok = build_tiny(3)
    trained = LLMPolicy(model, tok, LoraConfig(r=4, alpha=8))
    trained.load_state_dict(load_checkpoint(ckpt)["model"])
    student = _student()
    want = _logprobs(trained)
    with torch.no_grad(), trained.model.disable_adapter():
        base = _logprobs(trained)
    assert (want - base).abs().max() > 1e-2  # the adapters did move the model: a merge that dropped them would show
    for target in (run_dir.path, ckpt, Path(os.path.relpath(run_dir.path, tmp_path))):
        teacher = llm_teacher(TeacherConfig(name_or_path=str(target)), student, tmp_path)
        assert not any(p.requires_grad for p in teacher.parameters())
        assert not any("lora_" in n for n, _ in teacher.named_parameters())  # merged, not wrapped
        torch.testing.assert_close(_logprobs(student, teacher), want, atol=1e-5, rtol=0)


def test_a_grpo_run_folder_teaches_a_distill_run(grpo_teacher_run, tmp_path):
    cfg = load_config(_config(tmp_path, grpo_teacher_run.path))
    cfg._config_dir = HERE
    run_dir = RunDir.create("distill", tmp_path / "run")
    train_agentic(cfg, run_dir, engine=load_engine("tiny"))
    rows = [r for r in read_metrics(run_dir.metrics_path) if "teacher_reverse_kl" in r]
    assert len(rows) == 2 and all(r["sessions_error"] == 0 and r["teacher_tokens"] >= 4 for r in rows)
    # the teacher is another model than the student (seed 3's tiny, trained): the KL estimate is far from 0 (~6.5)
    assert abs(rows[0]["teacher_reverse_kl"]) > 0.1, rows[0]


def _env_run(tmp_path: Path) -> Path:
    """A PPO CartPole run folder as the trainer writes it: its resolved config and one checkpoint."""
    import gymnasium as gym

    from polar.config.loader import dump_config
    from polar.models.policy import build_policy

    cfg = validate(RunConfig, {"name": "cp", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
                               "policy": {"type": "ppo"}, "logging": {"tensorboard": False}})
    run = RunDir.create(cfg.name, tmp_path / "env_run", config_dir=None)
    run.write_config(dump_config(cfg))
    env = gym.make("CartPole-v1")
    policy = build_policy(cfg, env.observation_space, env.action_space)
    env.close()
    CheckpointManager(run.checkpoints_dir).save(1, {"policy": policy.state_dict(), "iteration": 1})
    return run.path


def _llm_run_with(tmp_path: Path, checkpoint: bytes | None) -> Path:
    """An LLM agent run folder (its resolved config) whose one checkpoint file holds ``checkpoint`` (None: no
    checkpoint yet)."""
    from polar.config.loader import dump_config

    cfg = validate(RunConfig, {"name": "llm", "harness": {"type": "agent", "callable": "agents_for_tests:one_token"},
                               "tasks": "tasks.jsonl", "model": {"name_or_path": "tiny"}, "policy": {"type": "grpo"}})
    run = RunDir.create(cfg.name, tmp_path / "llm_run", config_dir=None)
    run.write_config(dump_config(cfg))
    run.checkpoints_dir.mkdir(parents=True, exist_ok=True)
    if checkpoint is not None:
        (run.checkpoints_dir / "ckpt_00000001.pt").write_bytes(checkpoint)
    return run.path


@pytest.mark.parametrize("case", ["env_run", "missing_folder", "missing_checkpoint", "outside_a_run", "corrupt",
                                  "no_checkpoint_yet"])
def test_a_teacher_that_is_not_an_llm_run_is_refused_in_one_line_naming_the_key(tmp_path, case):
    if case == "env_run":
        target, match = _env_run(tmp_path), r"is an env run \(policy.type ppo\), not an LLM's"
    elif case == "missing_folder":
        target, match = tmp_path / "runs" / "nope", r"does not exist; give a preset"
    elif case == "missing_checkpoint":
        target, match = tmp_path / "runs" / "nope" / "checkpoints" / "ckpt_00000002.pt", r"does not exist"
    elif case == "outside_a_run":
        target, match = tmp_path / "ckpt_00000001.pt", r"is not a polar run directory"
        torch.save({"model": {}}, target)
    elif case == "no_checkpoint_yet":
        target, match = _llm_run_with(tmp_path, None), r"llm_run has no checkpoint yet; give a run that has saved one$"
    else:
        target, match = _llm_run_with(tmp_path, b"not a checkpoint"), r"checkpoint \S+ckpt_00000001.pt is unreadable"
    with pytest.raises(ConfigError, match=r"^policy.kwargs.teacher.name_or_path '[^']+': .*" + match) as err:
        llm_teacher(TeacherConfig(name_or_path=str(target)), _student(), tmp_path)
    assert "\n" not in str(err.value)
