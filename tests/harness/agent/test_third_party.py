"""A real third-party agent package (smolagents, pip-installed, unmodified) runs end to end as a session."""

import re

import pytest

from polar.harness.agent.runners import CallableRunner
from polar.harness.agent.verifiers import Numeric
from polar.rollout.sessions.local import LocalStack
from polar.rollout.sessions.pipeline import PipelineSettings
from polar.rollout.sessions.session import SessionStatus
from tests.agent_support.helpers import HERE

pytest.importorskip("smolagents")


def smol_script(tokenizer):
    """The 'model': call the calculator, then smolagents' final_answer tool with what it returned."""

    def respond(request, index):
        text = tokenizer.decode(request.prompt_ids)
        asked = list(re.finditer(r"What is (\d+ [-+*] \d+)\?", text))[-1]  # the task, not the prompt's examples
        seen = re.findall(r"(?:Observation:|<tool_response>)\s*(-?\d+)", text[asked.end():])
        if seen:
            return '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "%s"}}\n</tool_call>' % seen[-1]  # noqa: UP031
        return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>' % asked.group(1)  # noqa: UP031

    return respond


def test_smolagents_tool_calling_agent_through_the_gateway(tmp_path):
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    engine = ScriptedEngine(tok, smol_script(tok), model_name="tiny", context_length=1 << 16)
    runner = CallableRunner("agents_for_tests:smolagents_calculator", HERE)
    settings = PipelineSettings(agent_timeout_s=300, workspace_root=str(tmp_path / "ws"), builder="prefix_merging")
    with LocalStack(engine, runner, Numeric(), settings) as stack:
        (r,), = stack.run_groups([({"prompt": "What is 6 * 7?", "answer": 42}, 1, {})], timeout_s=600)
    assert r.status == SessionStatus.DONE, r.error
    assert r.reward == 1.0 and r.output.strip() == "42", (r.output, r.num_calls, r.verifier_output)
    assert r.num_calls == 2  # calculator call, then final_answer
    # both calls are trainable model tokens; the tool observation in between is masked
    assert r.trainable
    trained = "".join(tok.decode([t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]) for s in r.samples)
    assert "calculator" in trained and "final_answer" in trained and "Observation" not in trained
