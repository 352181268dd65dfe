"""An agent run speaks in sessions: a progress line per step (sessions done/total, signal share, reward,
tokens/s) instead of env words, a line while a step collects, and per-step session rates (tool calls,
timeouts, fully masked sessions) in metrics.jsonl."""

import logging
import sys

import pytest

from polar.cli.main import main as polar_main
from polar.config import load_config
from polar.inference import ScriptedEngine
from polar.inference.tiny import build_tiny_tokenizer
from polar.metrics.logger import read_metrics
from polar.rollout.sessions.collector import SessionCollector
from polar.trainers.build import train_agentic
from polar.trainers.run_dir import RunDir
from tests.agent_support.helpers import EXAMPLES, HERE, oracle_script, write_jsonl

SLOW = """
name: slow
harness: {type: agent, callable: "agents_for_tests:ask_then_sleep", timeout_s: 1.5}
tasks: tasks.jsonl
verifier: {type: "agents_for_tests:always_one"}
model: {name_or_path: tiny}
policy:
  type: grpo
  kwargs: {group_size: 2, tasks_per_step: 2, total_steps: 2, micro_batch_size: 16, max_off_policy_steps: 0,
           dynamic_sampling: {max_extra_rounds: 0}}  # one round a step: the session counts below are the plan
logging: {checkpoint_freq: 0, tensorboard: false}
"""


def test_agent_run_progress_is_in_session_words_with_a_line_while_collecting(tmp_path, caplog, monkeypatch):
    sys.path.insert(0, str(HERE))
    monkeypatch.setattr(SessionCollector, "HEARTBEAT_S", 0.2)
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": "quick", "prompt": "Say hi.", "sleep_s": 0.6},
                                           {"id": "stuck", "prompt": "Say ho.", "sleep_s": 30}])
    (tmp_path / "run.yaml").write_text(SLOW)
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        rc = polar_main(["run", "--config", str(tmp_path / "run.yaml"), "--run-dir", str(run), "--log-every-s", "0"])
    assert rc == 0
    lines = [r.getMessage() for r in caplog.records]
    collecting = [m for m in lines if m.startswith("step 1: collecting")]
    assert collecting and "sessions finished" in collecting[-1], lines
    progress = [r.getMessage() for r in caplog.records if r.name == "polar.progress"]
    assert len(progress) == 2 and progress[-1].startswith("step 2/2 done: 8/8 sessions (100%), signal "), progress
    assert "tokens/s" in progress[-1] and "timeouts 50%" in progress[-1], progress
    assert not any("env steps" in m or "fps" in m for m in progress), progress
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "iteration" in r]
    assert [r["sessions/timeout_rate"] for r in rows] == [0.5, 0.5]
    assert all(r["sessions/masked_rate"] == 0.0 and r["sessions/sampled_tokens_per_s"] > 0 for r in rows)


@pytest.fixture
def calculator(tmp_path):
    cfg = load_config(EXAMPLES / "calculator_grpo.yaml", ["policy.kwargs.total_steps=1", "policy.kwargs.group_size=2",
                                                          "policy.kwargs.tasks_per_step=2"])
    return cfg.model_copy(update={"sft_warmup": None, "eval_tasks": None})


def test_tool_call_rate_is_a_step_metric(tmp_path, calculator):
    """The oracle calls the calculator tool, then answers: one model call in two is a tool call."""
    engine = ScriptedEngine.tiny(oracle_script(build_tiny_tokenizer()))
    run_dir = RunDir.create("calc", tmp_path / "run")
    train_agentic(calculator, run_dir, engine=engine)
    (row,) = [r for r in read_metrics(run_dir.path / "metrics.jsonl") if "iteration" in r]
    assert row["sessions/tool_call_rate"] == 0.5, row
    assert row["sessions/timeout_rate"] == 0.0 and row["sessions/error_rate"] == 0.0


def test_a_held_out_evaluation_says_how_far_it_is_while_it_runs(tmp_path, caplog, monkeypatch):
    """The held-out pass before and after GRPO runs hundreds of sessions for minutes; it reports the sessions
    finished every EVAL_HEARTBEAT_S instead of going quiet until its result."""
    from polar.trainers import agentic_run

    sys.path.insert(0, str(HERE))
    monkeypatch.setattr(agentic_run, "EVAL_HEARTBEAT_S", 0.2)
    tasks = [{"id": "quick", "prompt": "Say hi.", "sleep_s": 0.6}, {"id": "slow", "prompt": "Say ho.", "sleep_s": 1.2}]
    write_jsonl(tmp_path / "tasks.jsonl", tasks)
    write_jsonl(tmp_path / "heldout.jsonl", tasks)
    (tmp_path / "run.yaml").write_text(SLOW.replace("tasks: tasks.jsonl", "tasks: tasks.jsonl\neval_tasks: heldout.jsonl")
                                       .replace("total_steps: 2", "total_steps: 1"))
    with caplog.at_level(logging.INFO):
        rc = polar_main(["run", "--config", str(tmp_path / "run.yaml"), "--run-dir", str(tmp_path / "run"),
                         "--log-every-s", "0"])
    assert rc == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("held-out evaluation (before_grpo)")]
    assert lines and "sessions finished" in lines[-1], [r.getMessage() for r in caplog.records]
    assert any("held-out evaluation (after_grpo)" in r.getMessage() for r in caplog.records)
