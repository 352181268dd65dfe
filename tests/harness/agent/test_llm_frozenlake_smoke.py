"""examples/llm_frozenlake.yaml on the tiny model: `polar run` completes a short GRPO run with the LLM agent
on FrozenLake and records every session (episode numbers, invalid_action counts) in the run directory."""

import json
import os
import shutil
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
    shutil.copy(ROOT / "examples" / "llm_frozenlake_shaping.py", tmp_path)  # agent.reward.function, if the example shapes
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(path), "--run-dir", str(run),
                           "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the run's own log lines, but not one line per model call the agent made through the openai SDK (httpx2)
    assert "INFO polar." in proc.stderr and "HTTP Request:" not in proc.stderr, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "reward_mean" in r] == [1, 2]
    sessions = [json.loads(line) for line in (run / "sessions" / "index.jsonl").read_text().splitlines()]
    train = [s for s in sessions if "rollout_step" in s.get("metadata", {})]
    assert len(train) == 2 * 2 * 2 and all(s["status"] in ("done", "timeout") for s in train), sessions[:2]
    for s in train:
        v = s["verifier_output"]
        assert {"invalid_actions", "steps", "success", "calls"} <= set(v)
        assert 1 <= v["steps"] <= 3 and 0 <= v["invalid_actions"] <= v["steps"]
        # the session reward is the episode's shaped return, which its turns (what step_advantage credits) add up to
        assert len(v["turns"]) == v["steps"] and s["reward"] == round(sum(t["reward"] for t in v["turns"]), 6)
        assert v["success"] or s["reward"] < 1.0
    assert (run / "eval" / "before_grpo.json").exists() and (run / "eval" / "after_grpo.json").exists()


def test_polar_run_trains_a_value_head_critic_with_lora_and_resumes_it(tmp_path):
    """The seed's "critic over hidden states" end to end: ``advantage: value_head`` with LoRA on the tiny
    model, one episode per task (no group), through ``polar run``; the head is checkpointed and a resumed
    run continues from it."""
    from polar.trainers.checkpoint import load_checkpoint

    cfg = yaml.safe_load((ROOT / "examples" / "llm_frozenlake.yaml").read_text())
    cfg["model"] = {"name_or_path": "tiny"}
    cfg["agent"].update(max_steps=3, max_tokens=8, invalid_action_penalty=-0.1)
    cfg["tasks"] = {"source": "seeds", "start": 0, "count": 8}
    cfg["eval_tasks"] = None
    cfg["policy"]["kwargs"].update(group_size=1, tasks_per_step=4, total_steps=2, lora={"r": 4, "alpha": 8},
                                   advantage="value_head", value_head={"hidden_units": 16}, step_advantage=None)
    cfg["logging"]["checkpoint_freq"] = 1
    shutil.copy(ROOT / "examples" / "llm_frozenlake_shaping.py", tmp_path)
    path = tmp_path / "critic.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def polar(*args: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "polar.cli.main", *args, "--no-progress"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]

    def critic_steps() -> list[dict]:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if "value_loss" in r]

    polar("run", "--config", str(path), "--run-dir", str(run))
    learned = critic_steps()
    assert [r["step"] for r in learned] == [1, 2], learned
    for r in learned:
        assert r["value_loss"] >= 0 and r["turns"] >= 4 and r["update_skipped"] == 0
        assert all(r[k] == r[k] for k in ("value_loss", "value_mean", "explained_variance"))  # no NaN
    ckpts = sorted((run / "checkpoints").glob("ckpt_*.pt"))
    assert len(ckpts) == 2
    state = load_checkpoint(ckpts[-1])
    heads = [v for v in (state, *(x for x in state.values() if isinstance(x, dict))) if "value_head" in v]
    assert heads and all(t.ndim >= 1 for t in heads[0]["value_head"].values()), sorted(state)
    # the resumed run loads the head (a missing one is refused by name) and continues the step count
    polar("resume", str(run), "-o", "policy.kwargs.total_steps=4")
    assert [r["step"] for r in critic_steps()] == [1, 2, 3, 4]
