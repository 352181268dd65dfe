"""examples/llm_frozenlake.yaml on the tiny model: `polar run` completes a short GRPO run with the LLM agent
on FrozenLake and records every session (episode numbers, invalid_action counts) in the run directory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def test_polar_run_trains_the_llm_agent_on_frozenlake_with_the_tiny_model(tmp_path):
    cfg = yaml.safe_load((ROOT / "examples" / "llm_frozenlake.yaml").read_text())
    cfg["model"] = {"name_or_path": "tiny"}
    cfg["agent"].update(max_steps=3, max_tokens=8, invalid_action_penalty=-0.1)
    cfg["tasks"] = {"source": "seeds", "start": 0, "count": 4}
    cfg["eval_tasks"] = {"source": "seeds", "start": 100000, "count": 2}
    cfg["policy"]["kwargs"].update(group_size=2, tasks_per_step=2, total_steps=2, lora=None)
    cfg["logging"]["checkpoint_freq"] = 1
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(path), "--run-dir", str(run),
                           "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "reward_mean" in r] == [1, 2]
    sessions = [json.loads(line) for line in (run / "sessions" / "index.jsonl").read_text().splitlines()]
    train = [s for s in sessions if "rollout_step" in s.get("metadata", {})]
    assert len(train) == 2 * 2 * 2 and all(s["status"] in ("done", "timeout") for s in train), sessions[:2]
    for s in train:
        v = s["verifier_output"]
        assert {"invalid_actions", "steps", "success", "calls"} <= set(v)
        assert 1 <= v["steps"] <= 3 and 0 <= v["invalid_actions"] <= v["steps"]
        assert s["reward"] == round(-0.1 * v["invalid_actions"] + (1.0 if v["success"] else 0.0), 6)
    assert (run / "eval" / "before_grpo.json").exists() and (run / "eval" / "after_grpo.json").exists()
