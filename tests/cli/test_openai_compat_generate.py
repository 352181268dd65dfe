"""``polar generate`` from a stronger model behind an OpenAI-compatible endpoint, and the trainers' refusal.

The "stronger model" is an oracle ScriptedEngine behind polar's own gateway on 127.0.0.1 (every third answer
wrong, so rejection sampling has work to do); the run's ``model`` section names it as ``engine: openai_compat``
with its key in an environment variable. The dataset is written in the student's (tiny) tokenizer, and SFT on
the tiny student learns from it. The key never reaches the output, the working folder or the logs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polar.cli.main import main as polar_main
from polar.config.gateway import GatewayConfig
from polar.gateway.server import GatewayServer
from tests.agent_support.helpers import EXAMPLES, oracle_script

KEY = "sk-generate-test-5f0c1e-never-on-disk"
KEY_ENV = "POLAR_TEST_TEACHER_KEY"


@pytest.fixture
def teacher(tmp_path: Path) -> Any:
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer

    engine = ScriptedEngine.tiny(oracle_script(build_tiny_tokenizer(), wrong_every=3))
    gw = GatewayServer(GatewayConfig(accept_any_model=True), engine=engine, records_dir=tmp_path / "teacher").start()
    yield gw
    gw.stop()


def _overrides(url: str) -> list[str]:
    return ["-o", "model.engine=openai_compat", "-o", f"model.base_url={url}/v1", "-o", "model.model=oracle",
            "-o", f"model.api_key_env={KEY_ENV}", "-o", "model.tokenizer=tiny"]


def test_generate_from_an_openai_compat_teacher_writes_a_dataset_sft_trains_on(
        teacher: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from polar.algorithms.sft import sft_train
    from polar.config.grpo import SFTKwargs
    from polar.inference.embedded import EmbeddedEngine
    from polar.inference.tiny import build_tiny
    from polar.models.llm_policy import LLMPolicy, load_demonstrations

    monkeypatch.setenv(KEY_ENV, KEY)
    caplog.set_level("DEBUG")
    out = tmp_path / "out" / "teacher.parquet"
    rc = polar_main(["generate", "--config", str(EXAMPLES / "calculator_grpo.yaml"), *_overrides(teacher.url),
                     "--out", str(out), "--samples-per-task", "3", "--max-tasks", "4", "--keep-work-dir"])
    assert rc == 0
    counts = json.loads(Path(str(out) + ".json").read_text())
    assert counts["sessions"] == 12 and counts["accepted_sessions"] == 8, counts  # every third answer is wrong

    model, tok = build_tiny(0)
    samples = load_demonstrations(out, tok)
    assert len(samples) == 8
    for s in samples:
        target = tok.decode([t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m])
        assert "<tool_call>" in target and '"name": "calc"' in target  # the teacher's turns, in the student's ids
        assert "<tool_response>" not in target
    student = LLMPolicy.from_engine(EmbeddedEngine(model, tok, model_name="tiny"))
    losses = sft_train(student, samples, SFTKwargs(learning_rate=3e-3, epochs=2, batch_size=4))
    assert losses[-1] < losses[0]

    # the teacher's calls are recorded as text, with ids in the student's tokenizer and no logprobs
    work = Path(counts["work_dir"])
    recs = [json.loads(line) for f in (work / "gateway" / "sessions").rglob("*.jsonl") for line in f.open()]
    assert recs and all(r["metadata"]["token_source"] == "retokenized" for r in recs)
    assert all(r["metadata"]["endpoint"]["model"] == "oracle" for r in recs)
    # the key: sent to the endpoint (which filed the calls under its hash), never written or logged
    from polar.gateway.sessions import key_session_id

    assert teacher.records(key_session_id(KEY))
    for f in tmp_path.rglob("*"):
        if f.is_file() and "teacher" not in f.parts:  # the endpoint's own records are the endpoint's business
            assert KEY.encode() not in f.read_bytes(), f
    assert KEY not in caplog.text


@pytest.mark.parametrize("policy", ["grpo", "sft"])
def test_grpo_and_sft_refuse_an_openai_compat_policy_in_one_line(policy: str, tmp_path: Path, capsys: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import yaml

    from tests.agent_support.helpers import HERE

    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.syspath_prepend(str(HERE))  # the harness module, as the run would import it
    assert str(HERE) in sys.path
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "t", "prompt": "hi"}) + "\n")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "name": "refused", "tasks": "tasks.jsonl", "verifier": {"type": "none"},
        "harness": {"type": "agent", "callable": "agents_for_tests:ask_once"},
        "policy": {"type": policy}, "model": {"name_or_path": "tiny"}}))
    rc = polar_main(["run", "--config", str(tmp_path / "run.yaml"), *_overrides("http://127.0.0.1:9"),
                     "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc != 0 and not (tmp_path / "run").exists()
    line = next(ln for ln in err.splitlines() if "openai_compat" in ln)
    assert "model.engine: openai_compat" in line and "no weights to update" in line and f"policy.type {policy}" in line


def test_openai_compat_config_needs_base_url_and_model(tmp_path: Path, capsys: Any) -> None:
    rc = polar_main(["generate", "--config", str(EXAMPLES / "calculator_grpo.yaml"), "-o", "model.engine=openai_compat",
                     "--out", str(tmp_path / "x.parquet")])
    err = capsys.readouterr().err
    assert rc != 0 and "model.base_url" in err


def test_eval_suite_scores_an_openai_compat_model_on_held_out_agent_tasks(tmp_path: Path) -> None:
    """``polar eval --suite`` with a policy ``model: {engine: openai_compat, ...}``: the calculator agent's
    held-out tasks run against the endpoint (an oracle behind polar's gateway), scored by the run's verifier."""
    import os
    import subprocess
    import sys

    import yaml

    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer

    engine = ScriptedEngine.tiny(oracle_script(build_tiny_tokenizer()))
    gw = GatewayServer(GatewayConfig(accept_any_model=True), engine=engine, records_dir=tmp_path / "teacher").start()
    try:
        tasks = (EXAMPLES / "heldout.jsonl").read_text().splitlines()[:3]
        (tmp_path / "heldout.jsonl").write_text("\n".join(tasks) + "\n")
        suite = {
            "name": "hosted", "parallel": {"backend": "local", "workers": 1},
            "policies": [{"name": "teacher", "model": {"engine": "openai_compat", "base_url": f"{gw.url}/v1",
                                                        "model": "oracle", "api_key_env": KEY_ENV}}],
            "harnesses": [{"name": "calculator", "kind": "agent", "policies": ["teacher"],
                           "config": str(EXAMPLES / "calculator_grpo.yaml"), "tasks": "heldout.jsonl"}],
        }
        (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
        proc = subprocess.run([sys.executable, "-m", "polar.cli.main", "eval", "--suite", str(tmp_path / "suite.yaml"),
                               "--out", str(tmp_path / "report")], capture_output=True, text=True, timeout=600,
                              env={**os.environ, KEY_ENV: KEY})
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads((tmp_path / "report" / "report.json").read_text())
        (row,) = report["results"]
        assert row["error"] is None and row["n"] == 3
        assert row["metrics"]["success_rate"]["mean"] == 1.0, row  # the oracle solves every task
        assert KEY not in (tmp_path / "report" / "report.json").read_text()
    finally:
        gw.stop()


def test_generate_with_an_unreachable_endpoint_fails_at_start_in_one_line(tmp_path: Path, capsys: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setenv(KEY_ENV, KEY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = polar_main(["generate", "--config", str(EXAMPLES / "calculator_grpo.yaml"),
                     *_overrides(f"http://127.0.0.1:{port}"), "--out", str(tmp_path / "x.parquet")])
    err = capsys.readouterr().err
    assert rc != 0 and not (tmp_path / "x.parquet").exists()
    line = next(ln for ln in err.splitlines() if "unreachable" in ln)
    assert f"model.base_url http://127.0.0.1:{port}/v1 is unreachable" in line and "harness_error" not in err


LEAK_PROBE = """
import json, os, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
    data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
urllib.request.urlopen(req, timeout=60).read()
print("KEY=" + os.environ.get("%s", "absent"))
"""


def test_command_harness_cannot_read_the_teacher_key_from_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent program (untrusted: the policy drives it) inherits polar's environment, minus the variable
    that holds the openai_compat endpoint's key."""
    import yaml

    from polar.config import load_config
    from polar.inference import ScriptedEngine
    from polar.trainers.build import build_session_stack

    monkeypatch.setenv(KEY_ENV, KEY)
    teacher = GatewayServer(GatewayConfig(accept_any_model=True), engine=ScriptedEngine.tiny(["hello"] * 4),
                            records_dir=tmp_path / "teacher").start()
    try:
        (tmp_path / "probe.py").write_text(LEAK_PROBE % KEY_ENV)
        (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "t", "prompt": "hi"}) + "\n")
        (tmp_path / "run.yaml").write_text(yaml.safe_dump({
            "name": "leak", "tasks": "tasks.jsonl", "verifier": {"type": "none"}, "policy": {"type": "grpo"},
            "harness": {"type": "agent", "command": ["{python}", "{config_dir}/probe.py"], "timeout_s": 60},
            "model": {"engine": "openai_compat", "base_url": f"{teacher.url}/v1", "model": "m",
                      "api_key_env": KEY_ENV}}))
        cfg = load_config(tmp_path / "run.yaml")
        with build_session_stack(cfg, tmp_path / "work") as stack:
            (group,) = stack.run_groups([({"id": "t", "prompt": "hi"}, 1, {})])
        (res,) = group
        assert res.status.value == "done", res.error
        assert res.output.strip() == "KEY=absent"
    finally:
        teacher.stop()
