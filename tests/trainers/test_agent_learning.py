"""`polar run`'s agentic path on the tiny model: SFT warm-up then GRPO; parameters change, reward rises.

The task is trivially learnable: SFT teaches the model to answer "done" or "hello" (half each); the
verifier rewards "hello"; GRPO has to move the choice, which it can in a handful of steps."""

import json

import torch

from polar.config import load_config
from polar.metrics.logger import read_metrics
from polar.trainers.build import train_agentic
from polar.trainers.run_dir import RunDir
from tests.agent_support.helpers import HERE, write_jsonl


def test_sft_then_grpo_raises_reward_on_a_trivial_task(tmp_path):
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "prompt": f"Say something {i}."} for i in range(4)])
    write_jsonl(tmp_path / "demos.jsonl", [{"messages": [{"role": "user", "content": "Say something."},
                                                         {"role": "assistant", "content": ["done", "hello"][i % 2]}]}
                                           for i in range(8)])
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text("""
name: trivial
harness: {type: agent, callable: "agents_for_tests:one_token", timeout_s: 120}
tasks: tasks.jsonl
eval_tasks: tasks.jsonl
verifier: {type: "agents_for_tests:says_hello"}
model: {name_or_path: tiny}
sessions: {max_run_workers: 64}
sft_warmup: {demonstrations: demos.jsonl, kwargs: {learning_rate: 1.0e-2, epochs: 20, max_steps: 20, batch_size: 4}}
policy:
  type: grpo
  kwargs: {group_size: 6, tasks_per_step: 4, total_steps: 6, learning_rate: 5.0e-2, micro_batch_size: 24,
           max_off_policy_steps: 1, eval_samples: 12, kl_coef: 0.01}
logging: {checkpoint_freq: 3, tensorboard: false}
""")
    import sys

    sys.path.insert(0, str(HERE))  # the harness/verifier module lives next to this test
    cfg = load_config(cfg_path)
    cfg._config_dir = HERE
    cfg = cfg.model_copy(update={"tasks": str(tmp_path / "tasks.jsonl"), "eval_tasks": str(tmp_path / "tasks.jsonl")})
    cfg._config_dir = HERE
    cfg.sft_warmup.demonstrations = str(tmp_path / "demos.jsonl")
    run_dir = RunDir.create("trivial", tmp_path / "run")

    from polar.inference import load_engine

    engine = load_engine("tiny")
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    summary = train_agentic(cfg, run_dir, engine=engine)

    after = engine.model.state_dict()  # the serving engine got the trained weights through the drain
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2
    assert summary["sft"]["updates"] == 20 and summary["sft"]["last"]["sft_loss"] < summary["sft"]["first"]["sft_loss"]
    b, a = summary["eval_before"]["success"], summary["eval_after"]["success"]
    rows = [r for r in read_metrics(run_dir.metrics_path) if "reward_mean" in r]
    assert a >= b + 0.2, (b, a, [r["reward_mean"] for r in rows])
    assert len(rows) == 6 and rows[-1]["reward_mean"] > rows[0]["reward_mean"]
    # SFT sync + one per GRPO step that updated (a step whose groups all agree has nothing to learn)
    updates = sum(not r["update_skipped"] for r in rows)
    assert updates >= 1 and engine.policy_version == 1 + updates == rows[-1]["policy_version"]
    assert all(r["sessions_error"] == 0 for r in rows)
    assert sorted(p.name for p in run_dir.checkpoints_dir.glob("ckpt_*.pt"))[-1] == "ckpt_00000006.pt"
    assert json.loads((run_dir.path / "eval" / "summary.json").read_text())["grpo"]["steps"] == 6
