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
from tests.agent_support.helpers import EXAMPLES, oracle_script


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


GENERATE_SLOW = """
name: slow
harness: {type: agent, callable: "agents_for_tests:ask_then_sleep", timeout_s: 1.5}
tasks: tasks.jsonl
verifier: {type: "agents_for_tests:always_one"}
model: {name_or_path: tiny}
policy: {type: grpo}
"""


@pytest.mark.parametrize("keep", [False, True])
def test_generate_shows_progress_why_sessions_dropped_and_works_beside_the_output(tmp_path, caplog, capsys, keep):
    """Progress lines while sessions run, the drop reasons at the end (2 timeouts here), and a working folder
    next to the output (never an unnamed temp dir): removed after success unless --keep-work-dir."""
    import logging
    import sys

    from tests.agent_support.helpers import HERE, write_jsonl

    sys.path.insert(0, str(HERE))
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "prompt": f"Say {i}.", "sleep_s": [0, 30][i % 2]}
                                           for i in range(4)])
    (tmp_path / "run.yaml").write_text(GENERATE_SLOW)
    out = tmp_path / "data" / "demos.parquet"
    with caplog.at_level(logging.INFO, logger="polar.generate"):
        rc = polar_main(["generate", "--config", str(tmp_path / "run.yaml"), "--out", str(out), "--samples-per-task",
                         "1", "--progress-every-s", "0.2", *(["--keep-work-dir"] if keep else [])])
    assert rc == 0
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("generate: ")]
    assert any("sessions finished" in m for m in progress), progress
    err = capsys.readouterr().err
    assert "accepted 2/4 sessions" in err and "dropped 2: timeout" in err, err
    counts = json.loads((tmp_path / "data" / "demos.parquet.json").read_text())
    assert counts["dropped"] == {"timeout": {"sessions": 2, **counts["dropped"]["timeout"]}}
    work = list((tmp_path / "data").glob("demos.parquet.work-*"))
    if keep:
        assert len(work) == 1 and (work[0] / "gateway" / "sessions").is_dir() and counts["work_dir"] == str(work[0])
        assert str(work[0]) in err
    else:
        assert work == [] and counts["work_dir"] is None


def test_generate_on_an_env_run_config_says_it_needs_an_agent_run(tmp_path, capsys):
    # an env run has no tasks or sessions to collect: one line naming the config, not an AttributeError
    out = tmp_path / "d.parquet"
    rc = polar_main(["generate", "--config", str(EXAMPLES.parent / "cartpole_ppo.yaml"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc != 0 and not out.exists()
    assert "cartpole_ppo.yaml is an env run" in err and "Traceback" not in err
