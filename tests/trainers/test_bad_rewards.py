"""Bad input from the user's side of a GRPO run: a verifier that returns NaN, or a reward outside the range the
config declares (a success rate: [0, 1]), is named with its task and never averaged in; a tasks file whose
tasks share an id is refused before the run directory exists."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar.config.agentic import VerifierConfig
from polar.errors import ConfigError
from polar.harness.agent.runners import CallableRunner
from polar.harness.agent.tasks import load_tasks
from polar.harness.agent.verifiers import checked_verifier
from polar.rollout.sessions.local import LocalStack
from polar.rollout.sessions.pipeline import PipelineSettings
from polar.rollout.sessions.session import SessionStatus
from polar.rollout.sessions.stats import success_rate
from tests.agent_support.helpers import HERE, write_jsonl

ROOT = HERE.parent.parent


def _sessions(tmp_path, verifier_cfg, tasks):
    from polar.inference import load_engine

    sys.path.insert(0, str(HERE))
    settings = PipelineSettings(agent_timeout_s=120, workspace_root=str(tmp_path / "ws"))
    runner = CallableRunner("agents_for_tests:one_token", HERE)
    with LocalStack(load_engine("tiny"), runner, checked_verifier(verifier_cfg, HERE), settings) as stack:
        return stack.run_groups([(t, 2, {}) for t in tasks], timeout_s=300)


def test_verifier_returning_nan_is_named_with_its_task_and_not_averaged(tmp_path, caplog):
    tasks = [{"id": "nan-task", "kind": "nan", "prompt": "Say it."}, {"id": "fine", "kind": "easy", "prompt": "Say it."}]
    with caplog.at_level(logging.WARNING, logger="polar.harness.agent.verifiers"):
        bad, good = _sessions(tmp_path, VerifierConfig(type="rewards_for_tests:by_kind"), tasks)
    assert all(r.status == SessionStatus.ERROR and r.reward is None for r in bad)
    assert all("returned nan for task 'nan-task'" in (r.error or "") for r in bad)
    assert all(not r.trainable for r in bad)
    assert all(r.status == SessionStatus.DONE and r.reward == 1.0 for r in good)
    # the log names the task once; the held-out mean counts the bad sessions as errors, not as a NaN
    assert sum("nan-task" in m for m in caplog.messages) == 1
    res = success_rate([bad, good])
    assert res["errors"] == 2 and res["reward_mean"] == 0.5


def test_reward_outside_the_declared_success_rate_range_is_named(tmp_path):
    tasks = [{"id": "too-good", "kind": "over", "prompt": "Say it."}]
    cfg = VerifierConfig(type="rewards_for_tests:by_kind", reward_range=(0.0, 1.0))
    (group,) = _sessions(tmp_path, cfg, tasks)
    assert all(r.status == SessionStatus.ERROR for r in group)
    assert all("returned 2 for task 'too-good', outside verifier.reward_range [0, 1]" in (r.error or "") for r in group)
    # without a declared range a reward of 2 is a reward like any other
    (group,) = _sessions(tmp_path, VerifierConfig(type="rewards_for_tests:by_kind"), tasks)
    assert all(r.status == SessionStatus.DONE and r.reward == 2.0 for r in group)


def test_reward_range_must_be_ordered():
    with pytest.raises(ValueError, match=r"reward_range \[1, 0\]: the low end is above the high end"):
        VerifierConfig(type="exact_match", reward_range=(1.0, 0.0))


def test_tasks_sharing_one_id_are_refused(tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"id": "same", "prompt": f"Say {i}."} for i in range(3)])
    with pytest.raises(ConfigError, match=r"tasks.jsonl:2: task id 'same' is already the id of line 1 "
                                          r"\(so far every task has it\); give each task its own 'id'"):
        load_tasks(str(path))


RUN = """
name: dup
harness: {type: agent, callable: "agents_for_tests:one_token", timeout_s: 60}
tasks: tasks.jsonl
verifier: {type: "rewards_for_tests:by_kind"}
model: {name_or_path: tiny}
policy: {type: grpo, kwargs: {group_size: 2, tasks_per_step: 1, total_steps: 1}}
"""


def test_polar_run_refuses_a_tasks_file_of_one_id_before_the_run_directory_exists(tmp_path: Path):
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": "same", "prompt": f"Say {i}."} for i in range(4)])
    (tmp_path / "dup.yaml").write_text(RUN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "-c", "dup.yaml", "--run-dir", "the-run"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode != 0
    assert "task id 'same' is already the id of line 1 (so far every task has it)" in out.stderr + out.stdout
    assert not (tmp_path / "the-run").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"difficulty_filter": {"low": 0.9, "high": 0.1}}, "difficulty_filter: low 0.9 is above high 0.1"),
    ({"loss_aggregation": "gspo", "step_advantage": {}}, "loss_aggregation gspo takes one advantage per sequence"),
    ({"loss_aggregation": "gspo", "tis_cap": 2.0}, "loss_aggregation gspo already weighs each sequence"),
])
def test_grpo_options_that_cannot_work_together_are_named(kwargs, message):
    from pydantic import ValidationError

    from polar.config.grpo import GRPOKwargs

    with pytest.raises(ValidationError, match=message):
        GRPOKwargs(**kwargs)


def test_a_curriculum_that_advances_needs_its_starting_levels_and_only_on_training_tasks():
    from pydantic import ValidationError

    from polar.config.llm_agent import ReasoningGymTasks
    from polar.config.run import validate_run_config

    with pytest.raises(ValidationError, match=r"tasks\.advance raises curriculum levels, and tasks\.curriculum is not set"):
        ReasoningGymTasks(name="chain_sum", advance={})
    source = {"source": "reasoning_gym", "name": "chain_sum", "curriculum": {"num_terms": 0}, "advance": {}}
    with pytest.raises(ConfigError, match=r"eval_tasks\.advance: held-out tasks keep their levels"):
        validate_run_config({"name": "x", "harness": {"type": "agent", "callable": "m:f"},
                             "tasks": {**source, "seed": 0}, "eval_tasks": {**source, "seed": 5000},
                             "policy": {"type": "grpo"}})
