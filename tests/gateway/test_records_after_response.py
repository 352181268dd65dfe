"""A call's record is built and written after its response went out, so it costs the caller no latency, and
the session's next call still sees it; with ``fsync: true`` it is on disk before the response."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from polar.gateway.sessions import SessionStore
from polar.inference.base import GenerationRequest, TokenEvent
from polar.inference.scripted import ScriptedEngine

CLOSE_S = 0.5  # how long the engine takes to close an aborted stream (an upstream's HTTP stream closing)


def _order(gw: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """'sent' when the gateway sends a response's last body chunk, 'written' when it appends records to disk."""
    events: list[str] = []
    write = SessionStore._write

    def logged_write(self: SessionStore, path: Any, lines: list[bytes]) -> None:
        write(self, path, lines)
        events.append("written")

    monkeypatch.setattr(SessionStore, "_write", logged_write)
    guard = gw.app.asgi  # HostOriginGuard: uvicorn calls it, it calls .app on every request
    inner = guard.app

    async def watching(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def logged_send(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                events.append("sent")

        await inner(scope, receive, logged_send)

    monkeypatch.setattr(guard, "app", watching)
    return events


def _chat(gw: Any, content: str, stream: bool = False) -> None:
    body = {"model": "tiny", "max_tokens": 3, "stream": stream, "messages": [{"role": "user", "content": content}]}
    r = httpx.post(f"{gw.url}/s/order/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text


def _settled(events: list[str], n: int) -> list[str]:
    """``events`` once it holds ``n`` entries: the server writes a record just after the client got its
    response, on the server's thread, so the client may look a moment before that (bounded wait)."""
    deadline = time.monotonic() + 30
    while len(events) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return list(events)


def test_the_record_is_written_after_the_response_is_sent(gateway, scripted, monkeypatch):
    gw = gateway(scripted(["one", "two", "three"]))
    events = _order(gw, monkeypatch)
    _chat(gw, "first")
    assert _settled(events, 2) == ["sent", "written"]
    _chat(gw, "second", stream=True)
    assert _settled(events, 4) == ["sent", "written", "sent", "written"]
    _chat(gw, "third")  # the next call of the session counts on the records before it
    assert [r.call_index for r in gw.records("order")] == [0, 1, 2]
    assert all(r.complete for r in gw.records("order"))


def test_with_fsync_the_record_is_on_disk_before_the_response(gateway, scripted, monkeypatch):
    gw = gateway(scripted(["one", "two"]), fsync=True)
    events = _order(gw, monkeypatch)
    _chat(gw, "first")
    assert _settled(events, 2) == ["written", "sent"]
    _chat(gw, "second", stream=True)
    assert _settled(events, 4) == ["written", "sent", "written", "sent"]


def test_a_client_that_read_its_stream_finds_the_call_in_the_session_even_an_aborted_one(gateway, tiny):
    """The stream's end is sent only once the call is in the store: a client that reads its stream to the
    end and at once asks for the session (records, trajectory) sees the call, even when the engine aborted
    the stream and takes a while to close it."""

    class AbortsSlowly(ScriptedEngine):
        async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
            try:
                yield TokenEvent(self._end_id - 1, -1.0)
                yield TokenEvent(None, None, "abort", self.policy_version)
                yield TokenEvent(self._end_id, -1.0, "stop")  # never reached: the gateway stops at the abort
            finally:
                await asyncio.sleep(CLOSE_S)

    model, tokenizer = tiny
    gw = gateway(AbortsSlowly(tokenizer, ["unused"], model=model, model_name="tiny"))
    body = {"model": "tiny", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    for n in (1, 2):
        with httpx.stream("POST", f"{gw.url}/s/aborted/v1/chat/completions", json=body, timeout=60) as r:
            text = r.read().decode()
        assert r.status_code == 200 and "aborted the request" in text, text
        recs = httpx.get(f"{gw.url}/sessions/aborted", timeout=60).json()["records"]
        assert [(x["call_index"], x["complete"], x["finish_reason"]) for x in recs] == [
            (i, False, "abort") for i in range(n)], recs
        assert len(gw.records("aborted")) == n


def test_a_record_built_early_by_a_concurrent_reader_is_still_written_when_its_response_ends(gateway, scripted,
                                                                                             monkeypatch):
    """Between a call's end and its response going out, another request on the loop (a second session's
    call, ``GET /sessions``) may read the store, which builds the deferred record. That record must still
    reach the session file when the response ends, not wait in memory for some later call."""
    gw = gateway(scripted(["one"]))
    store = gw.app.store
    respond = gw.app._json

    def read_meanwhile(*args: Any, **kwargs: Any) -> Any:
        store.records("another-session")  # what a concurrent request does on the loop at this moment
        return respond(*args, **kwargs)

    monkeypatch.setattr(gw.app, "_json", read_meanwhile)
    _chat(gw, "first")
    path = store.dir / "order.jsonl"
    deadline = time.monotonic() + 10
    while not (path.exists() and path.read_bytes().count(b"\n") == 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.exists() and path.read_bytes().count(b"\n") == 1, "the call's record was never written"
