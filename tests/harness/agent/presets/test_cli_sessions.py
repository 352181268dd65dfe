"""Each coding CLI, unmodified, runs a swe_mini session through polar: real gateway on loopback, the
tiny model (or a scripted engine over the tiny model's tokenizer and weights, for tool calls), the
preset's sandbox, the session pipeline, the SWE-style grader, and both trajectory builders.

Claude Code and Codex get a scripted first answer: a shell tool call that fixes the task. The gateway
streams it back in the CLI's own protocol, the CLI runs it, sends the tool result, and the grader must
then find the task resolved. Qwen Code, Gemini CLI and Pi talk to the random tiny model: nonsense
answers, but every call must be captured with token ids and logprobs, and the session graded 0.
"""

from __future__ import annotations

import json
from typing import Any

import psutil
import pytest

from polar.harness.agent.presets import get_preset
from polar.rollout.sessions.session import SessionStatus
from polar.trajectory import build

pytestmark = pytest.mark.cli

FIX_MEDIAN = (
    "python3 -c \"import pathlib; p = pathlib.Path('stats_lite/core.py'); "
    "p.write_text(p.read_text().replace('return values[len(values) // 2]', "
    "'n = len(values)\\n    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2'))\""
)
# Small prompts (the CLI's own flags) and short answers keep a session well inside the tiny model's
# context and a CPU's patience.
OPTIONS = {"compact": True, "max_output_tokens": 48}


def scripted_fixer(tiny: tuple[Any, Any], tool: str, arg: str) -> Any:
    """A ScriptedEngine over the tiny model: a tool call that fixes ``median`` first, then a final answer."""
    from polar.inference.scripted import ScriptedEngine

    model, tokenizer = tiny
    call = "<tool_call>\n" + json.dumps({"name": tool, "arguments": {arg: FIX_MEDIAN}}) + "\n</tool_call>"

    def respond(request: Any, index: int) -> str:
        prompt = tokenizer.decode(request.prompt_ids)
        return "The median is fixed." if "<tool_response>" in prompt else call

    return ScriptedEngine(tokenizer, respond, model=model, model_name="tiny", context_length=16384)


def tiny_engine(tiny: tuple[Any, Any]) -> Any:
    from polar.inference.embedded import EmbeddedEngine

    model, tokenizer = tiny
    return EmbeddedEngine(model, tokenizer, model_name="tiny", context_length=16384, max_batch_size=4)


def session_processes(session_id: str) -> list[int]:
    """Processes still carrying the session's environment (every process a preset starts has it)."""
    needle = f"POLAR_SESSION_ID={session_id}".encode()
    alive = []
    for proc in psutil.process_iter(["pid"]):
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    alive.append(proc.pid)
        except OSError:
            continue
    return alive


def check_session(result: Any, gw: Any) -> list[Any]:
    """Captured calls with prompt/sampled ids and logprobs; verified; trajectories from both builders;
    nothing left running."""
    assert result.status == SessionStatus.DONE, f"{result.status}: {result.error}"
    assert session_processes(result.session_id) == []
    assert result.reward is not None and "resolved" in result.verifier_output
    # the CLI's own transcript reached the verifier
    assert result.verifier_output["transcript_events"] > 0 and result.verifier_output["transcript_files"]
    records = gw.records(result.session_id)
    assert len(records) >= 1 and result.num_calls == len(records)
    for rec in records:
        assert rec.complete and rec.error is None
        assert rec.prompt_ids and rec.sampled_ids
        assert len(rec.logprobs) == len(rec.sampled_ids) and all(lp <= 0.0 for lp in rec.logprobs)
        assert rec.model == "tiny"
    for builder in ("per_request", "prefix_merging"):
        samples, _ = build(records, builder)
        assert samples, builder
        for s in samples:
            assert len(s.token_ids) == len(s.loss_mask) == len(s.logprobs)
            assert sum(s.loss_mask) > 0
        sampled = sum(sum(s.loss_mask) for s in samples)
        assert sampled == sum(len(r.sampled_ids) for r in records) if builder == "per_request" else sampled > 0
    return records


@pytest.mark.parametrize(("preset", "tool", "arg"), [("claude_code", "Bash", "command"), ("codex", "exec_command", "cmd")])
def test_cli_streams_a_gateway_tool_call_and_resolves_the_task(preset: str, tool: str, arg: str, tiny: Any, cli: Any,
                                                               gateway: Any, run_session: Any, swe_tasks: Any) -> None:
    cli(preset)
    gw = gateway(scripted_fixer(tiny, tool, arg), default_max_tokens=256)
    result = run_session(gw, preset, swe_tasks["median"], {**OPTIONS, "max_output_tokens": 512})
    records = check_session(result, gw)
    assert len(records) >= 2, "the CLI must call back with the tool's result"
    assert records[0].metadata.get("stream", True), "the CLI streams"
    first = records[0]
    assert any(t.get("function", t).get("name") == tool for t in first.tools)
    followup = records[-1].messages
    assert any(m.get("role") == "tool" for m in followup), "the tool result reaches the gateway"
    assert result.reward == 1.0 and result.verifier_output["resolved"], result.verifier_output


@pytest.mark.parametrize("preset", ["qwen_code", "gemini_cli", "pi"])
def test_cli_runs_unchanged_against_the_tiny_model(preset: str, tiny: Any, cli: Any, gateway: Any, run_session: Any,
                                                   swe_tasks: Any) -> None:
    cli(preset)
    aliases = list(get_preset(preset).extra_model_names)
    gw = gateway(tiny_engine(tiny), default_max_tokens=48, model_aliases=aliases)
    result = run_session(gw, preset, swe_tasks["median"], {**OPTIONS, "max_session_turns": 2} if preset == "qwen_code" else OPTIONS)
    check_session(result, gw)
    assert result.reward == 0.0  # nonsense answers change nothing; an empty diff scores 0


SHELL_TOOLS = {"claude_code": ("Bash", "command"), "codex": ("exec_command", "cmd"), "qwen_code": ("run_shell_command", "command"),
               "gemini_cli": ("run_shell_command", "command"), "pi": ("bash", "command")}


@pytest.mark.slow
@pytest.mark.parametrize("preset", list(SHELL_TOOLS))
def test_cli_in_its_default_configuration_resolves_the_task(preset: str, tiny: Any, cli: Any, gateway: Any,
                                                            run_session: Any, swe_tasks: Any) -> None:
    """No ``compact``: the CLI's full system prompt and tool list (20k-46k tokens) reach the gateway.
    The scripted engine skips the forward pass (fixed logprobs), so 45k-token prompts stay cheap."""
    from polar.inference.scripted import ScriptedEngine

    cli(preset)
    tokenizer = tiny[1]
    tool, arg = SHELL_TOOLS[preset]
    call = "<tool_call>\n" + json.dumps({"name": tool, "arguments": {arg: FIX_MEDIAN}}) + "\n</tool_call>"
    engine = ScriptedEngine(tokenizer, lambda r, i: "Fixed." if "<tool_response>" in tokenizer.decode(r.prompt_ids) else call,
                            model_name="tiny", context_length=200_000)
    gw = gateway(engine, default_max_tokens=256, model_aliases=list(get_preset(preset).extra_model_names))
    result = run_session(gw, preset, swe_tasks["median"], {}, agent_timeout_s=150)
    records = check_session(result, gw)
    assert len(records[0].prompt_ids) > 3000 and len(records[0].tools) >= 4
    assert result.reward == 1.0, result.verifier_output
