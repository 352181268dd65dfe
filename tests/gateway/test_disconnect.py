"""A client that hangs up stops its generation, streaming or not, and leaves an incomplete record
(``complete=false``, never trained on), as docs/gateway.md promises."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from polar.inference.base import Engine, GenerationRequest

TOKENS = 2000  # at 0.05 s a token the generation would take 100 s; the test's budget is 30 s


class Watched(Engine):
    """Delegates to another engine; notes the first token and whether the stream was closed early."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.tokenizer, self.model_name = inner.tokenizer, inner.model_name
        self.context_length, self.default_stop_token_ids = inner.context_length, inner.default_stop_token_ids
        self.first_token = threading.Event()
        self.cancelled = threading.Event()
        self.generated = 0

    async def generate(self, request: GenerationRequest):
        done = False
        try:
            async for ev in self.inner.generate(request):
                self.generated += 1
                self.first_token.set()
                yield ev
                if ev.finish_reason:
                    done = True
        finally:
            if not done:
                self.cancelled.set()


def _post_then_hang_up(url: str, path: str, body: dict, engine: Watched) -> None:
    """A real HTTP/1.1 client on a raw socket: send the request, wait until tokens are being generated,
    then close the connection without reading the response."""
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(raw)}\r\n\r\n".encode() + raw
        )
        assert engine.first_token.wait(30), "the engine never started generating"


@pytest.mark.parametrize("stream", [False, True])
def test_client_hanging_up_cancels_generation(stream, gateway, scripted):
    engine = Watched(scripted(lambda req, i: [17] * TOKENS, token_delay_s=0.05))
    gw = gateway(engine)
    body = {"model": "tiny", "stream": stream, "max_tokens": TOKENS,
            "messages": [{"role": "user", "content": "write a lot"}]}
    _post_then_hang_up(gw.url, "/s/gone/v1/chat/completions", body, engine)

    assert engine.cancelled.wait(30), "generation kept running after the client hung up"
    deadline = time.monotonic() + 30
    while not gw.records("gone") and time.monotonic() < deadline:
        time.sleep(0.02)
    (rec,) = gw.records("gone")
    assert rec.complete is False and "disconnected" in rec.error and rec.finish_reason == "abort"
    assert 0 < len(rec.sampled_ids) < TOKENS and engine.generated < TOKENS
    assert httpx.get(f"{gw.url}/health", timeout=30).json()["inflight"] == 0
