"""A real run with rollout workers and connector processes: every metrics row carries the stage timings and
per-process system metrics by role, and the learner's log lines land in RUN/logs/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_keydoor_run_logs_system_metrics_per_role_and_stage_timings(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "polar.cli.main", "run", "--config", str(EXAMPLES / "keydoor" / "demo.yaml"),
         "-o", "total_env_steps=512", "-o", "distribution.rollout_workers=2", "-o", "distribution.envs_per_worker=2",
         "-o", "logging.tensorboard=false", "-o", "logging.system_metrics_s=0.2", "-o", "eval.at_end=false",
         "--run-dir", str(run), "--no-progress"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    for stage in ("collect", "learn", "publish", "eval"):
        assert last[f"time/{stage}_s"] >= 0
    assert last["time/collect_s"] > 0 and last["time/learn_s"] > 0
    assert 0 < last["rollout/fragment_collect_s_max"] < 600
    roles = {k.split("/")[1] for k in last if k.startswith("system/") and k.endswith("/rss_mb")}
    assert {"learner", "rollout_worker-0", "rollout_worker-1", "connector-0", "connector-1"} <= roles
    assert all(last[f"system/{r}/rss_mb"] > 1 for r in roles)
    assert last["system/processes"] >= 5
    assert len(list((run / "logs").glob("rollout_worker-*.jsonl"))) == 2  # one file per worker process
    logs = list((run / "logs").glob("learner-*.jsonl"))
    assert len(logs) == 1
    lines = [json.loads(line) for line in logs[0].read_text().splitlines()]
    assert lines and {r["role"] for r in lines} == {"learner"} and {r["run_id"] for r in lines} == {"run"}


def test_agent_run_start_up_lines_land_in_the_run_logs(tmp_path):
    """The agent stack (engine, gateway, rollout service) starts while the loop is composed, before it trains:
    its start-up lines belong to the run's RUN/logs/ all the same."""
    from polar.config import load_config
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer
    from polar.metrics.logs import read_logs
    from polar.trainers.build import train_agentic
    from polar.trainers.run_dir import RunDir
    from tests.agent_support.helpers import EXAMPLES as AGENT_EXAMPLES
    from tests.agent_support.helpers import oracle_script

    cfg = load_config(AGENT_EXAMPLES / "calculator_grpo.yaml", ["policy.kwargs.total_steps=1",
                                                                 "policy.kwargs.group_size=2",
                                                                 "policy.kwargs.tasks_per_step=2"])
    cfg = cfg.model_copy(update={"sft_warmup": None, "eval_tasks": None})
    run_dir = RunDir.create("calc", tmp_path / "run")
    train_agentic(cfg, run_dir, engine=ScriptedEngine.tiny(oracle_script(build_tiny_tokenizer())))
    lines = read_logs(run_dir.path, role="learner")
    started = [r for r in lines if r["logger"] == "polar.rollout.sessions.nodes"
               and r["msg"].startswith("gateway node local registered at http://127.0.0.1:")]
    assert started, [r["msg"] for r in lines]
    assert started[0]["run_id"] == run_dir.path.name
