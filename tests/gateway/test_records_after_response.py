"""A call's record is built and written after its response went out, so it costs the caller no latency, and
the session's next call still sees it; with ``fsync: true`` it is on disk before the response."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from polar.gateway.sessions import SessionStore


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


def test_the_record_is_written_after_the_response_is_sent(gateway, scripted, monkeypatch):
    gw = gateway(scripted(["one", "two", "three"]))
    events = _order(gw, monkeypatch)
    _chat(gw, "first")
    _chat(gw, "second", stream=True)
    assert events == ["sent", "written", "sent", "written"]
    _chat(gw, "third")  # the next call of the session counts on the records before it
    assert [r.call_index for r in gw.records("order")] == [0, 1, 2]
    assert all(r.complete for r in gw.records("order"))


def test_with_fsync_the_record_is_on_disk_before_the_response(gateway, scripted, monkeypatch):
    gw = gateway(scripted(["one", "two"]), fsync=True)
    events = _order(gw, monkeypatch)
    _chat(gw, "first")
    _chat(gw, "second", stream=True)
    assert events[:2] == ["written", "sent"] and events[2:] == ["written", "sent"]
