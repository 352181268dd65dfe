"""Replay what the five coding CLIs really sent (tests/harness/agent/presets/fixtures/, captured from the pinned
versions by ``python -m tests.harness.agent.presets.capture_cli``) against a real gateway, byte for byte: same
path, query, headers and body. Each must be served in its provider's wire format, with the model
name the client asked for, and recorded with token ids and logprobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.config.gateway import GatewayConfig
from polar.gateway.server import GatewayServer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODEL_PATHS = ("/v1/messages", "/v1/responses", "/v1/chat/completions", ":streamGenerateContent", ":generateContent")
DROP_HEADERS = {"host", "content-length", "accept-encoding", "connection"}


def _calls() -> list[tuple[str, int, dict[str, Any]]]:
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        rec = json.loads(path.read_text())
        for i, req in enumerate(rec["requests"]):
            if req["method"] == "POST" and req["path"].endswith(MODEL_PATHS):
                out.append((path.stem, i, req))
    return out


CALLS = _calls()


def sse_events(text: str) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) for each SSE event; ``[DONE]`` kept as a string."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            raw = "\n".join(data)
            events.append((name, raw if raw == "[DONE]" else json.loads(raw)))
    return events


@pytest.fixture(scope="module")
def replay_gateway(tmp_path_factory: pytest.TempPathFactory):
    """One gateway for every replay: a scripted engine (no forward pass) with room for 50k-token prompts."""
    from polar.inference.scripted import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer

    engine = ScriptedEngine(build_tiny_tokenizer(), lambda req, i: "Looked at it.", model_name="tiny",
                            context_length=200_000, fixed_logprob=-0.5)
    gw = GatewayServer(GatewayConfig(default_max_tokens=32), engine=engine,
                       records_dir=tmp_path_factory.mktemp("records")).start()
    yield gw
    gw.stop()


def check_anthropic(req: dict[str, Any], resp: httpx.Response) -> None:
    model = req["body"]["model"]
    if not req["body"].get("stream"):
        body = resp.json()
        assert body["type"] == "message" and body["model"] == model
        return
    events = sse_events(resp.text)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    assert events[0][1]["message"]["model"] == model
    assert "content_block_delta" in names and "message_delta" in names
    stop = [d for n, d in events if n == "message_delta"][-1]["delta"]["stop_reason"]
    assert stop in ("end_turn", "max_tokens", "tool_use", "stop_sequence")


def check_responses(req: dict[str, Any], resp: httpx.Response) -> None:
    model = req["body"]["model"]
    if not req["body"].get("stream"):
        assert resp.json()["model"] == model
        return
    events = sse_events(resp.text)
    types = [d["type"] for _, d in events]
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    done = events[-1][1]["response"]
    assert done["model"] == model and done["status"] == "completed"
    assert any(item["type"] == "message" for item in done["output"])
    assert "response.output_text.delta" in types and "response.output_item.done" in types


def check_chat(req: dict[str, Any], resp: httpx.Response) -> None:
    model = req["body"]["model"]
    if not req["body"].get("stream"):
        assert resp.json()["model"] == model
        return
    events = sse_events(resp.text)
    assert events[-1][1] == "[DONE]"
    chunks = [d for _, d in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == model for c in chunks)
    assert any(ch.get("finish_reason") for c in chunks for ch in c["choices"])
    if (req["body"].get("stream_options") or {}).get("include_usage"):
        assert chunks[-1]["usage"]["completion_tokens"] >= 1


def check_gemini(req: dict[str, Any], resp: httpx.Response) -> None:
    events = sse_events(resp.text) if "stream" in req["path"] else [(None, resp.json())]
    assert events, resp.text[:300]
    parts = [p for _, d in events for c in d["candidates"] for p in c["content"]["parts"]]
    assert any("text" in p for p in parts)
    assert events[-1][1]["candidates"][0]["finishReason"] in ("STOP", "MAX_TOKENS")


CHECKS = {"/v1/messages": check_anthropic, "/v1/responses": check_responses,
          "/v1/chat/completions": check_chat, "Content": check_gemini}


@pytest.mark.parametrize(("fixture", "index", "req"), CALLS, ids=[f"{f}-{i}" for f, i, _ in CALLS])
def test_gateway_serves_captured_cli_request(replay_gateway: GatewayServer, fixture: str, index: int,
                                              req: dict[str, Any]) -> None:
    session = f"replay-{fixture}-{index}"
    path = req["path"].replace("/s/ses-capture-0001", f"/s/{session}", 1)
    headers = {k: v for k, v in req["headers"].items() if k not in DROP_HEADERS}
    with httpx.Client(base_url=replay_gateway.url, timeout=60) as client:
        resp = client.post(path, params=req["query"], headers=headers, content=json.dumps(req["body"]))
    assert resp.status_code == 200, f"{fixture} {req['path']}: {resp.status_code} {resp.text[:500]}"
    check = next(fn for suffix, fn in CHECKS.items() if req["path"].endswith(suffix))
    check(req, resp)
    records = replay_gateway.records(session)
    assert len(records) == 1
    rec = records[0]
    assert rec.complete and rec.prompt_ids and rec.sampled_ids
    assert len(rec.logprobs) == len(rec.sampled_ids)
    assert rec.model == (req["body"].get("model") or req["path"].split("/models/")[1].split(":")[0])
    assert rec.tools, "the CLI's tool definitions must reach the record"


def _first(fixture: str) -> dict[str, Any]:
    rec = json.loads((FIXTURES / f"{fixture}.json").read_text())
    return next(r for r in rec["requests"] if r["method"] == "POST" and r["path"].endswith(MODEL_PATHS))


def _post(gw: GatewayServer, req: dict[str, Any], session: str, body: dict[str, Any] | None = None) -> httpx.Response:
    headers = {k: v for k, v in req["headers"].items() if k not in DROP_HEADERS}
    path = req["path"].replace("/s/ses-capture-0001", f"/s/{session}", 1)
    with httpx.Client(base_url=gw.url, timeout=60) as client:
        return client.post(path, params=req["query"], headers=headers, content=json.dumps(body or req["body"]))


def test_optional_fields_are_ignored_and_logged_once(replay_gateway: GatewayServer,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    from polar.gateway.providers import common

    common.IGNORED_ONCE.clear()
    req = _first("claude_code")
    with caplog.at_level("INFO", logger="polar.gateway.providers"):
        for i in range(2):
            assert _post(replay_gateway, req, f"logged-once-{i}").status_code == 200
    notes = [r.getMessage() for r in caplog.records if "accepted and ignored" in r.getMessage()]
    for field in ("thinking", "context_management", "output_config", "metadata"):
        assert sum(f"'{field}'" in n for n in notes) == 1, (field, notes)


@pytest.mark.parametrize(("fixture", "change", "error_path"), [
    ("codex", {"previous_response_id": "resp_123"}, ("error", "message")),
    ("pi", {"n": 2}, ("error", "message")),
    ("gemini_cli", {"generationConfig": {"candidateCount": 3}}, ("error", "message")),
])
def test_fields_that_change_the_meaning_are_rejected_in_the_provider_shape(
        replay_gateway: GatewayServer, fixture: str, change: dict[str, Any], error_path: tuple[str, str]) -> None:
    req = _first(fixture)
    resp = _post(replay_gateway, req, f"reject-{fixture}", {**req["body"], **change})
    assert resp.status_code == 400
    body = resp.json()
    assert isinstance(body[error_path[0]][error_path[1]], str)
    assert next(iter(change)) in body[error_path[0]][error_path[1]]
