"""``policy.kwargs.temperature`` and ``max_tokens`` are what a GRPO run's sessions sample with, whatever the
agent asks (the temperature replaces the agent's, max_tokens caps it), and the gateway's records say so."""

import json
import sys

from polar.config import load_config
from polar.inference import load_engine
from polar.trainers.build import train_agentic
from polar.trainers.run_dir import RunDir
from tests.agent_support.helpers import HERE, write_jsonl

CONFIG = """
name: sampling
harness: {type: agent, callable: "agents_for_tests:asks_its_own_sampling", timeout_s: 120}
tasks: tasks.jsonl
verifier: {type: "agents_for_tests:says_hello"}
model: {name_or_path: tiny}
policy:
  type: grpo
  kwargs: {group_size: 2, tasks_per_step: 2, total_steps: 1, micro_batch_size: 16, max_off_policy_steps: 0,
           temperature: 0.25, max_tokens: 3, dynamic_sampling: {max_extra_rounds: 0}}  # one round: 4 sessions
logging: {checkpoint_freq: 0, tensorboard: false}
"""


def _records(run_dir):
    rows = []
    for f in sorted((run_dir.path / "gateway" / "sessions").glob("*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def test_grpo_run_samples_with_the_configured_temperature_and_max_tokens(tmp_path):
    sys.path.insert(0, str(HERE))  # the harness/verifier module lives next to the tests
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "prompt": f"Say something {i}."} for i in range(2)])
    (tmp_path / "run.yaml").write_text(CONFIG)
    cfg = load_config(tmp_path / "run.yaml")
    cfg = cfg.model_copy(update={"tasks": str(tmp_path / "tasks.jsonl")})
    cfg._config_dir = HERE
    run_dir = RunDir.create("sampling", tmp_path / "run")
    train_agentic(cfg, run_dir, engine=load_engine("tiny"))

    rows = _records(run_dir)
    assert len(rows) == 4  # 2 tasks x 2 samples, one call each
    for r in rows:
        sampling = r["metadata"]["sampling"]
        assert sampling["temperature"] == 0.25 and sampling["max_tokens"] == 3, sampling
        assert sampling["requested"] == {"temperature": 1.0, "max_tokens": 48}
        assert 1 <= len(r["sampled_ids"]) <= 3


def test_resolved_rollout_sampling_defaults(tmp_path):
    """Unset, the rollout samples at temperature 1.0 and at most 64 tokens; with the built-in LLM agent, at the
    agent's own settings. The resolved values are written, so a resumed run samples as the first did."""
    (tmp_path / "run.yaml").write_text(CONFIG.replace("temperature: 0.25, max_tokens: 3", "eval_samples: 1"))
    kw = load_config(tmp_path / "run.yaml").policy.kwargs
    assert (kw.temperature, kw.max_tokens) == (1.0, 64)
