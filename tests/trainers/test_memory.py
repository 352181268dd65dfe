"""The memory an agent run needs is estimated before it starts, and a run that will not fit says so, with the
levers that lower it."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from polar.cli.main import main as polar_main
from polar.config import load_config
from polar.trainers import memory
from polar.trainers.memory import GIB, estimate_agent_run, memory_warning, model_shape

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "examples" / "agentic" / "real_model_grpo.yaml"


def test_the_measured_lora_run_is_estimated_near_its_peak():
    """examples/agentic/real_model_grpo.yaml (LoRA on SmolLM2-135M) peaked at about 6.7 GB."""
    cfg = load_config(REAL, ["model.engine=embedded"])
    total = estimate_agent_run(cfg, model_shape("smollm2-135m")).total
    assert 5.0e9 < total < 8.0e9, total / GIB
    warning = memory_warning(cfg, available=2 * GIB)
    assert warning is not None and "needs about 5.9 GiB" in warning and "2.0 GiB available" in warning
    assert "policy.kwargs.micro_batch_size (now 8)" in warning and "gradient_checkpointing: true" in warning
    assert memory_warning(cfg, available=64 * GIB) is None


def test_a_full_fine_tune_with_kl_counts_gradients_adam_and_the_reference(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 2048, "num_hidden_layers": 16, "vocab_size": 32000,
                                                    "torch_dtype": "bfloat16"}))
    with open(folder / "model.safetensors", "wb") as f:  # sparse: 2 GB of bf16 = 1e9 parameters
        f.truncate(2_000_000_000)
    shape = model_shape(str(folder))
    assert shape is not None and shape.params == 1_000_000_000
    (tmp_path / "run.yaml").write_text(f"""
name: big
harness: {{type: agent, callable: "my_agent:agent"}}
tasks: tasks.jsonl
model: {{name_or_path: {folder}}}
policy: {{type: grpo, kwargs: {{kl_coef: 0.05, micro_batch_size: 1}}}}
""")
    cfg = load_config(tmp_path / "run.yaml")
    parts = estimate_agent_run(cfg, shape).parts
    assert parts["learner"] == 16 * 10**9 and parts["KL reference"] == 4 * 10**9 and parts["engine"] == 4 * 10**9
    warning = memory_warning(cfg, available=16 * GIB)
    assert warning is not None and "policy.kwargs.lora: {}" in warning


def test_polar_run_warns_before_a_run_that_will_not_fit(tmp_path, monkeypatch, caplog):
    sys.path.insert(0, str(ROOT / "tests" / "agent_support"))
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    (tmp_path / "run.yaml").write_text("""
name: small
harness: {type: agent, callable: "agents_for_tests:one_token", timeout_s: 60}
tasks: tasks.jsonl
verifier: {type: "agents_for_tests:always_one"}
model: {name_or_path: tiny}
policy: {type: grpo, kwargs: {group_size: 2, tasks_per_step: 1, total_steps: 1}}
logging: {tensorboard: false}
""")
    monkeypatch.setattr(memory, "available_bytes", lambda: 256 * 1024**2)
    with caplog.at_level(logging.WARNING):
        rc = polar_main(["run", "--config", str(tmp_path / "run.yaml"), "--run-dir", str(tmp_path / "r")])
    assert rc == 0
    assert any("0.2 GiB available: it may be killed for memory" in r.getMessage() for r in caplog.records)
