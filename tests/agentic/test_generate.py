"""`polar generate`: rejection sampling by verifier reward into a dataset the SFT trainer reads."""

import json

import pytest

from polar.algorithms.sft import sft_train
from polar.cli.generate_cmd import generate
from polar.cli.main import main as polar_main
from polar.config import load_config
from polar.config.grpo import SFTKwargs
from polar.inference import ScriptedEngine
from polar.inference.tiny import build_tiny_tokenizer
from polar.models.llm_policy import LLMPolicy, load_demonstrations
from tests.agentic.helpers import EXAMPLES, oracle_script


def test_generate_keeps_only_verified_sessions_and_sft_reads_them(tmp_path):
    cfg = load_config(EXAMPLES / "calculator_grpo.yaml")
    engine = ScriptedEngine.tiny(oracle_script(build_tiny_tokenizer(), wrong_every=3))
    out = tmp_path / "accepted.parquet"
    counts = generate(cfg, out, samples_per_task=3, max_tasks=4, engine=engine, work_dir=tmp_path / "work")
    assert counts["sessions"] == 12
    assert counts["accepted_sessions"] == 8  # every third answer is wrong and rejected
    assert counts["status_counts"]["done"] == 12
    assert json.loads((tmp_path / "accepted.parquet.json").read_text())["samples"] == 8

    tok = engine.tokenizer
    samples = load_demonstrations(out, tok)
    assert len(samples) == 8  # prefix merging: one sequence per two-call session
    for s in samples:
        assert s.reward == 1.0
        text = tok.decode([t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m])
        assert "<tool_call>" in text and '"arguments": {"a":' in text  # only the model's own turns are targets
        assert "<tool_response>" not in text
    policy = LLMPolicy.from_engine(engine)
    losses = sft_train(policy, samples, SFTKwargs(learning_rate=3e-3, epochs=2, batch_size=4))
    assert losses[-1] < losses[0]


def test_generate_cli_reports_when_nothing_passes(tmp_path, capsys):
    # the random tiny model never solves a task: the command says so and writes nothing
    out = tmp_path / "none.parquet"
    rc = polar_main(["generate", "--config", str(EXAMPLES / "calculator_grpo.yaml"), "--out", str(out),
                     "--samples-per-task", "1", "--max-tasks", "2"])
    assert rc == 1 and not out.exists()
    assert json.loads((tmp_path / "none.parquet.json").read_text())["accepted_sessions"] == 0


@pytest.mark.slow  # one Python + openai import per session; the bad-input tests cover command harnesses by default
def test_command_harness_config_runs_the_agent_as_a_program(tmp_path):
    cfg = load_config(EXAMPLES / "calculator_command.yaml")
    engine = ScriptedEngine.tiny(oracle_script(build_tiny_tokenizer()))
    counts = generate(cfg, tmp_path / "d.parquet", samples_per_task=2, max_tasks=1, engine=engine, work_dir=tmp_path / "w")
    assert counts["accepted_sessions"] == 2, counts
