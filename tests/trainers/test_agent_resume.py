"""An agent-harness GRPO run continues from its last checkpoint: `polar resume`'s path for agentic runs.

The first run stops after 2 GRPO steps (as if killed after its checkpoint); the resumed run, with a fresh
engine, must start from the checkpointed weights and step, skip the SFT warm-up, and finish the steps."""

import sys

import torch

from polar.config import load_config
from polar.metrics.logger import read_metrics
from polar.trainers.build import train_agentic
from polar.trainers.checkpoint import load_checkpoint, save_checkpoint
from polar.trainers.run_dir import RunDir
from tests.agent_support.helpers import HERE, write_jsonl

CONFIG = """
name: resume
harness: {type: agent, callable: "agents_for_tests:one_token", timeout_s: 120}
tasks: tasks.jsonl
verifier: {type: "agents_for_tests:says_hello"}
model: {name_or_path: tiny}
sessions: {max_run_workers: 16}
sft_warmup: {demonstrations: demos.jsonl, kwargs: {learning_rate: 1.0e-2, epochs: 2, max_steps: 4, batch_size: 4}}
policy:
  type: grpo
  kwargs: {group_size: 4, tasks_per_step: 2, total_steps: TOTAL, learning_rate: 5.0e-2, micro_batch_size: 16,
           max_off_policy_steps: 0, eval_samples: 1}
logging: {checkpoint_freq: 1, tensorboard: false}
"""


def _config(tmp_path, total_steps):
    path = tmp_path / f"run_{total_steps}.yaml"
    path.write_text(CONFIG.replace("TOTAL", str(total_steps)))
    cfg = load_config(path)
    cfg = cfg.model_copy(update={"tasks": str(tmp_path / "tasks.jsonl"), "eval_tasks": str(tmp_path / "heldout.jsonl")})
    cfg._config_dir = HERE
    cfg.sft_warmup.demonstrations = str(tmp_path / "demos.jsonl")
    return cfg


def test_agentic_grpo_run_resumes_from_its_last_checkpoint(tmp_path):
    from polar.inference import load_engine

    sys.path.insert(0, str(HERE))  # the harness/verifier module lives next to the tests
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "prompt": f"Say something {i}."} for i in range(2)])
    write_jsonl(tmp_path / "heldout.jsonl", [{"id": f"h{i}", "prompt": f"Say anything {i}."} for i in range(2)])
    write_jsonl(tmp_path / "demos.jsonl", [{"messages": [{"role": "user", "content": "Say something."},
                                                         {"role": "assistant", "content": ["done", "hello"][i % 2]}]}
                                           for i in range(4)])
    run_dir = RunDir.create("resume", tmp_path / "run")
    first = train_agentic(_config(tmp_path, 2), run_dir, engine=load_engine("tiny"))
    assert first["grpo"]["steps"] == 2 and "sft" in first
    last = sorted(run_dir.checkpoints_dir.glob("ckpt_*.pt"))[-1]
    ckpt = load_checkpoint(last)
    assert ckpt["step"] == 2
    # the rewards seen so far (what tells a tie at the best reward from one below it) are in the checkpoint;
    # widened here so that the resumed run can only end with this range if it restored and kept it
    assert ckpt["reward_range"] is not None and ckpt["reward_range"][0] <= ckpt["reward_range"][1]
    ckpt["reward_range"] = [-100.0, 100.0]
    save_checkpoint(last, ckpt)

    before = run_dir.path / "eval" / "before_grpo.json"
    before_written = before.stat().st_mtime_ns
    engine = load_engine("tiny")  # a fresh process's engine: random weights until the checkpoint loads
    fresh = {k: v.clone() for k, v in engine.model.state_dict().items()}
    resumed_at: dict[str, torch.Tensor] = {}
    original = engine.update_weights

    async def spy(state_dict, version):  # the first sync after resuming must carry the checkpoint's weights
        if not resumed_at:
            resumed_at.update({k: v.clone() for k, v in state_dict.items()})
            resumed_at["_version"] = torch.tensor(version)
        return await original(state_dict, version)

    engine.update_weights = spy
    second = train_agentic(_config(tmp_path, 4), run_dir, resume=True, engine=engine)

    assert "sft" not in second  # the warm-up is not repeated on resume
    # nor the held-out score of the starting weights: the first run's is read back, not re-measured
    assert second["eval_before"] == first["eval_before"] and before.stat().st_mtime_ns == before_written
    assert second["eval_after"]["sessions"] == 2
    assert second["grpo"]["steps"] == 4
    assert int(resumed_at.pop("_version")) == ckpt["policy_version"]
    weights = {k: v for k, v in ckpt["model"].items() if k in resumed_at}
    assert weights and all(torch.equal(resumed_at[k], weights[k]) for k in weights)
    assert any(not torch.equal(fresh[k], resumed_at[k]) for k in weights)
    rows = [r for r in read_metrics(run_dir.metrics_path) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # the metrics file continues; no step is repeated or lost
    # every step that updated published one version; a step without a usable group published none
    updated = [r["step"] for r in rows[2:] if not r["update_skipped"]]
    assert engine.policy_version == ckpt["policy_version"] + len(updated)
    assert [r["policy_version"] for r in rows[2:]] == [ckpt["policy_version"] + sum(s <= step for s in updated)
                                                       for step in (3, 4)]
    assert sorted(p.name for p in run_dir.checkpoints_dir.glob("ckpt_*.pt"))[-1] == "ckpt_00000004.pt"
    assert load_checkpoint(run_dir.checkpoints_dir / "ckpt_00000004.pt")["reward_range"] == [-100.0, 100.0]
