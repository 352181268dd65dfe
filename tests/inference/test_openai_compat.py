"""``engine: openai_compat``: a gateway in front of another chat endpoint, over real HTTP on 127.0.0.1.

The upstream is polar's own gateway (the tiny embedded engine, or a ScriptedEngine that writes tool calls), or a
small scripted HTTP server for the failure statuses (401, 429 with Retry-After, an unreachable port). The
scenarios are the SDK ones the ``smollm2-135m`` gateway passes (tests/gateway/test_smollm2.py): openai chat
plain then streaming over two turns, anthropic and google-genai plain and streaming, and the tool-call round
trip of every provider, streaming or not.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.config.gateway import GatewayConfig
from polar.gateway.server import GatewayServer
from polar.inference.base import EngineError, UpstreamUnavailable
from polar.inference.openai_compat import OpenAICompatEngine, build_openai_compat

KEY = "sk-test-0123456789abcdef-never-on-disk"
KEY_ENV = "POLAR_TEST_UPSTREAM_KEY"
MAX_TOKENS = 8


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Callable[..., GatewayServer]]:
    servers: list[GatewayServer] = []

    def start(engine: Any, **config: Any) -> GatewayServer:
        gw = GatewayServer(GatewayConfig(**config), engine=engine, records_dir=tmp_path / f"records{len(servers)}").start()
        servers.append(gw)
        return gw

    yield start
    for gw in servers:
        gw.stop()


@pytest.fixture
def upstream_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def compat(url: str, **options: Any) -> OpenAICompatEngine:
    """An openai_compat engine over ``url`` (a polar gateway's /v1), its key in ``$POLAR_TEST_UPSTREAM_KEY``."""
    options.setdefault("api_key_env", KEY_ENV)
    return build_openai_compat(options.pop("model", "tiny"), base_url=f"{url}/v1", **options)


@pytest.fixture
def chain(gateway: Callable[..., GatewayServer], tiny_pair: Any, upstream_key: str) -> tuple[GatewayServer, GatewayServer]:
    """(outer, inner): the outer gateway's engine is the inner gateway (tiny embedded) as an openai_compat endpoint."""
    from polar.inference.embedded import EmbeddedEngine

    inner = gateway(EmbeddedEngine(tiny_pair[0], tiny_pair[1], model_name="tiny"))
    outer = gateway(compat(inner.url), accept_any_model=True)
    return outer, inner


def _inner_texts(inner: GatewayServer) -> list[str]:
    """Every answer the upstream recorded, in order (its session is the hash of the key the outer one sent)."""
    from polar.gateway.sessions import key_session_id

    return [r.metadata["output"]["content"] for r in inner.records(key_session_id(KEY))]


def test_openai_sdk_plain_then_streaming_multi_turn_through_openai_compat(chain: Any) -> None:
    from openai import OpenAI

    outer, inner = chain
    client = OpenAI(base_url=f"{outer.url}/s/oa/v1", api_key="x", max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
    r1 = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=MAX_TOKENS, temperature=0)
    assert r1.choices[0].finish_reason in ("stop", "length")
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "And Spain?"}]
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    up1, up2 = _inner_texts(inner)
    assert r1.choices[0].message.content == up1 and streamed == up2 and streamed
    rec1, rec2 = outer.records("oa")
    assert [rec1.metadata["output"]["content"], rec2.metadata["output"]["content"]] == [up1, up2]
    assert rec1.complete and rec1.metadata["token_source"] == "retokenized" and rec1.metadata["logprob_mode"] == "none"
    assert rec2.messages[1] == {"role": "assistant", "content": up1}  # the whole conversation went upstream
    # usage is the endpoint's own count
    (inner1, _) = inner.records(__import__("polar.gateway.sessions", fromlist=["x"]).key_session_id(KEY))
    assert r1.usage.completion_tokens == len(inner1.sampled_ids)


def test_anthropic_sdk_plain_and_streaming_through_openai_compat(chain: Any) -> None:
    import anthropic

    outer, inner = chain
    client = anthropic.Anthropic(base_url=f"{outer.url}/s/an", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "Say hello."}]
    m1 = client.messages.create(model="tiny", max_tokens=MAX_TOKENS, system="Be brief.", messages=msgs)  # type: ignore[arg-type]
    with client.messages.stream(model="tiny", max_tokens=MAX_TOKENS, messages=msgs) as s:  # type: ignore[arg-type]
        streamed = "".join(s.text_stream)
        m2 = s.get_final_message()
    up1, up2 = _inner_texts(inner)
    assert "".join(b.text for b in m1.content if b.type == "text") == up1
    assert streamed == up2 == "".join(b.text for b in m2.content if b.type == "text")
    rec1, _ = outer.records("an")
    assert rec1.messages[0] == {"role": "system", "content": "Be brief."}


def test_google_genai_sdk_plain_and_streaming_through_openai_compat(chain: Any) -> None:
    from google import genai
    from google.genai import types

    outer, inner = chain
    client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{outer.url}/s/ge", api_version="v1beta"))
    cfg = types.GenerateContentConfig(max_output_tokens=MAX_TOKENS, temperature=0)
    r = client.models.generate_content(model="tiny", contents="Name a colour.", config=cfg)
    streamed = "".join(c.text or "" for c in client.models.generate_content_stream(
        model="tiny", contents="Name a colour.", config=cfg))
    up1, up2 = _inner_texts(inner)
    assert (r.text or "") == up1 and streamed == up2
    assert len(outer.records("ge")) == 2


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip_of_every_sdk_through_openai_compat(stream: bool, gateway: Any, tiny_pair: Any,
                                                                 upstream_key: str) -> None:
    """The upstream writes a tool call (a ScriptedEngine behind polar's gateway); every provider's client gets
    it through the openai_compat gateway, sends the result back, and gets the final answer."""
    from polar.inference.scripted import ScriptedEngine
    from tests.gateway.test_tool_calls import ANSWER, CALL_TEXT, CLIENTS

    for provider, client in CLIENTS.items():
        inner = gateway(ScriptedEngine(tiny_pair[1], [CALL_TEXT, ANSWER], model_name="tiny"))
        outer = gateway(compat(inner.url), accept_any_model=True)
        content, call, answer = client(outer.url, stream)
        assert (content, call, answer) == ("I will add.", {"name": "add", "args": {"a": 1, "b": 2}}, ANSWER), provider
        rec1, rec2 = outer.records("tc")
        assert rec1.finish_reason == "tool_calls" and rec1.complete
        assert rec1.metadata["output"]["tool_calls"][0]["function"]["name"] == "add"
        # the second call's prompt reuses the first call's ids: a trajectory merges
        prefix = rec1.prompt_ids + rec1.sampled_ids
        assert rec2.prompt_ids[: len(prefix)] == prefix, provider
        tail = tiny_pair[1].decode(rec2.prompt_ids[len(prefix):])
        assert "<tool_response>" in tail, provider
        # the tool result went upstream as a tool message
        up2 = inner.records(__import__("polar.gateway.sessions", fromlist=["x"]).key_session_id(KEY))[1]
        assert any(m["role"] == "tool" for m in up2.messages), provider
        outer.stop()
        inner.stop()


def test_api_key_reaches_the_endpoint_and_never_the_records_or_logs(chain: Any, caplog: pytest.LogCaptureFixture,
                                                                     tmp_path: Path) -> None:
    from openai import OpenAI

    outer, inner = chain
    caplog.set_level("DEBUG")
    client = OpenAI(base_url=f"{outer.url}/s/k/v1", api_key="x", max_retries=0)
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert _inner_texts(inner)  # the inner gateway filed the call under the key's hash: the key was sent
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f
    assert KEY not in caplog.text


# ---- failures: a scripted HTTP endpoint on loopback ------------------------------------------------------------

class _Script(http.server.BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions with the server's next scripted (status, headers, body)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        srv: Any = self.server
        srv.seen.append((time.monotonic(), self.headers.get("authorization")))
        status, headers, body = srv.script.pop(0) if len(srv.script) > 1 else srv.script[0]
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        data = json.dumps(body).encode()
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        """``GET /v1/models`` (the engine's start-up probe): ``srv.get_status``, 200 by default."""
        srv: Any = self.server
        data = json.dumps({"object": "list", "data": []} if srv.get_status == 200 else
                          {"error": {"message": f"Incorrect API key provided: {self.headers.get('authorization')}"}})
        self.send_response(srv.get_status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted_endpoint() -> Iterator[Callable[[list[tuple[int, dict[str, str], Any]]], Any]]:
    servers: list[Any] = []

    def start(script: list[tuple[int, dict[str, str], Any]]) -> Any:
        srv: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Script)
        srv.script, srv.seen, srv.get_status = list(script), [], 200
        srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


OK_BODY = {"id": "c1", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def _ask(engine: OpenAICompatEngine) -> Any:
    import asyncio

    async def go() -> Any:
        body = engine.body([{"role": "user", "content": "hi"}], [], "auto", 4, 1.0, 1.0, [], None, False)
        try:
            return [x async for x in engine.chat(body)][-1]
        finally:
            await engine.close()

    return asyncio.run(go())


def test_missing_key_variable_is_one_line_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLAR_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(EngineError) as e:
        build_openai_compat("m", base_url="http://127.0.0.1:9/v1", api_key_env="POLAR_TEST_NO_SUCH_KEY")
    msg = str(e.value)
    assert "\n" not in msg and "model.api_key_env" in msg and "$POLAR_TEST_NO_SUCH_KEY" in msg and "not set" in msg


def test_unreachable_base_url_is_one_line_naming_the_url(upstream_key: str) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UpstreamUnavailable) as e:  # at start: the probe
        build_openai_compat("m", base_url=f"http://127.0.0.1:{port}/v1", api_key_env=KEY_ENV)
    msg = str(e.value)
    assert "\n" not in msg and f"model.base_url http://127.0.0.1:{port}/v1 is unreachable" in msg
    engine = build_openai_compat("m", base_url=f"http://127.0.0.1:{port}/v1", api_key_env=KEY_ENV, probe=False)
    with pytest.raises(UpstreamUnavailable) as e:  # at use: the same line
        _ask(engine)
    assert "\n" not in str(e.value) and f"model.base_url http://127.0.0.1:{port}/v1 is unreachable" in str(e.value)


def test_a_key_refused_at_start_is_one_line_naming_the_key_and_status(scripted_endpoint: Any,
                                                                       upstream_key: str) -> None:
    srv = scripted_endpoint([(200, {}, OK_BODY)])
    srv.get_status = 401
    with pytest.raises(EngineError) as e:
        build_openai_compat("m", base_url=f"{srv.url}/v1", api_key_env=KEY_ENV)
    msg = str(e.value)
    assert "\n" not in msg and "model.api_key_env" in msg and f"${KEY_ENV}" in msg and "HTTP 401" in msg
    assert KEY not in msg and "***" in msg  # the endpoint echoed the key: cut out


def test_api_key_env_that_holds_a_key_instead_of_a_name_is_refused_without_echoing_it() -> None:
    with pytest.raises(EngineError) as e:
        build_openai_compat("m", base_url="http://127.0.0.1:9/v1", api_key_env=KEY)
    assert "must name an environment variable" in str(e.value) and KEY not in str(e.value)


def test_401_is_one_line_naming_the_key_and_status_and_hides_an_echoed_key(scripted_endpoint: Any,
                                                                            upstream_key: str) -> None:
    srv = scripted_endpoint([(401, {}, {"error": {"message": f"Incorrect API key provided: {KEY}"}})])
    engine = build_openai_compat("m", base_url=f"{srv.url}/v1", api_key_env=KEY_ENV)  # the probe passes (200)
    with pytest.raises(EngineError) as e:
        _ask(engine)
    msg = str(e.value)
    assert "\n" not in msg and "model.api_key_env" in msg and f"${KEY_ENV}" in msg and "HTTP 401" in msg
    assert KEY not in msg and "***" in msg
    assert srv.seen[0][1] == f"Bearer {KEY}"  # the key went in the header, read from the variable at use


def test_429_is_retried_honouring_retry_after_then_served(scripted_endpoint: Any, upstream_key: str) -> None:
    srv = scripted_endpoint([(429, {"retry-after": "0.4"}, {"error": "slow down"}),
                             (429, {"retry-after": "0.3"}, {"error": "slow down"}), (200, {}, OK_BODY)])
    engine = build_openai_compat("m", base_url=f"{srv.url}/v1", api_key_env=KEY_ENV)
    result = _ask(engine)
    assert result.content == "fine" and result.retries == 2
    (t0, _), (t1, _), (t2, _) = srv.seen
    assert t1 - t0 >= 0.38 and t2 - t1 >= 0.28  # waited as told


def test_429_forever_gives_up_after_max_retries_in_one_line(scripted_endpoint: Any, upstream_key: str,
                                                            gateway: Any) -> None:
    srv = scripted_endpoint([(429, {"retry-after": "0"}, {"error": "quota"})])
    engine = build_openai_compat("m", base_url=f"{srv.url}/v1", api_key_env=KEY_ENV, max_retries=2)
    with pytest.raises(EngineError) as e:
        _ask(engine)
    msg = str(e.value)
    assert "\n" not in msg and "HTTP 429" in msg and "after 2 retries" in msg and f"${KEY_ENV}" in msg
    assert len(srv.seen) == 3
    # through a gateway: the client gets a 429 too, with the same line
    gw = gateway(build_openai_compat("m", base_url=f"{srv.url}/v1", api_key_env=KEY_ENV, max_retries=1),
                 accept_any_model=True)
    r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                   timeout=30)
    assert r.status_code == 429 and "HTTP 429" in r.json()["error"]["message"]


def test_polar_gateway_cli_serves_an_openai_compat_endpoint(chain: Any, tmp_path: Path) -> None:
    """``polar gateway --engine openai_compat --base-url URL --model NAME --api-key-env VAR``, in its own process:
    the key travels in the environment only (never on the command line), and a missing variable is one line."""
    import os
    import re
    import subprocess
    import sys

    _, inner = chain
    argv = [sys.executable, "-m", "polar.cli.main", "gateway", "--engine", "openai_compat", "--base-url",
            f"{inner.url}/v1", "--model", "tiny", "--api-key-env", KEY_ENV, "--port", "0"]
    env = {**os.environ, "COLUMNS": "200"}
    missing = subprocess.run([*argv, "--records-dir", str(tmp_path / "r0")], capture_output=True, text=True, timeout=120,
                             env={k: v for k, v in env.items() if k != KEY_ENV})
    assert missing.returncode != 0 and f"gateway.api_key_env names ${KEY_ENV}, which is not set" in missing.stderr
    proc = subprocess.Popen([*argv, "--records-dir", str(tmp_path / "r1")], stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline() if proc.stderr else ""
            if not line and proc.poll() is not None:
                break
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, "the gateway did not report its address"
        r = httpx.post(f"{url}/s/cli/v1/chat/completions", timeout=60,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == _inner_texts(inner)[-1]
    finally:
        proc.terminate()
        proc.wait(60)
        if proc.stderr:
            proc.stderr.close()


@pytest.mark.vllm
def test_gateway_over_vllm_chat_endpoint_records_its_token_ids_and_logprobs(launched_vllm: Any, gateway: Any) -> None:
    """vLLM's own /v1/chat/completions as an openai_compat endpoint with ``token_ids: true``: the records carry
    the ids vLLM consumed and sampled and its logprobs (``token_source: endpoint``), plain and streaming, and
    the sampled ids decode to the text the client got."""
    from openai import OpenAI

    folder = str(launched_vllm.model_folder)
    engine = build_openai_compat(launched_vllm.served_model, base_url=f"{launched_vllm.fleet.urls[0]}/v1",
                                 tokenizer=folder, token_ids=True, model_name="smol")
    gw = gateway(engine)
    client = OpenAI(base_url=f"{gw.url}/s/v/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r1 = client.chat.completions.create(model="smol", messages=msgs, max_tokens=MAX_TOKENS, temperature=0,  # type: ignore[arg-type]
                                        logprobs=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smol", messages=msgs, max_tokens=MAX_TOKENS, temperature=0, stream=True) if c.choices)  # type: ignore[arg-type]
    rec1, rec2 = gw.records("v")
    tok = engine.tokenizer
    for rec, text in ((rec1, r1.choices[0].message.content), (rec2, streamed)):
        assert rec.complete and rec.metadata["token_source"] == "endpoint" and rec.metadata["logprob_mode"] == "endpoint"
        assert len(rec.sampled_ids) == len(rec.logprobs) >= 1 and all(lp <= 0.0 for lp in rec.logprobs)
        assert tok.decode(rec.sampled_ids, skip_special_tokens=True) == text
        assert tok.decode(rec.prompt_ids).rstrip().endswith("<|im_start|>assistant")
    assert rec1.sampled_ids == rec2.sampled_ids  # greedy: the same answer, whole or streamed
    assert [c.logprob for c in r1.choices[0].logprobs.content] == pytest.approx(rec1.logprobs)  # type: ignore[union-attr]
