"""A small call stays on the event loop (a worker-thread hop costs more than its work); anything that could
hold the loop still goes to a worker thread: a big body, tools not validated before, a long new text."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

TOOLS = [{"type": "function", "function": {"name": "look", "description": "Look around.",
                                           "parameters": {"type": "object", "properties": {"where": {"type": "string"}}}}}]


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions the gateway sends to worker threads (``asyncio.to_thread``), in order (the engine's own
    hops, such as the scripted engine's logprob pass, are not the gateway's)."""
    seen: list[str] = []
    original = asyncio.to_thread

    async def counting(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if str(getattr(func, "__module__", "")).startswith("polar.gateway"):
            seen.append(getattr(func, "__qualname__", repr(func)))
        return await original(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    return seen


def chat(gw: Any, sid: str, content: str, tools: list[dict[str, Any]] | None = None, status: int = 200,
         stop: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    if tools:
        body["tools"] = tools
    if stop:
        body["stop"] = stop
    r = httpx.post(f"{gw.url}/s/{sid}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def test_a_small_call_takes_no_worker_thread_hop(gateway, scripted, hops):
    gw = gateway(scripted(["ok"] * 3))
    chat(gw, "a", "What is the capital of France?")  # warm: the system of segments is cached from here on
    hops.clear()
    chat(gw, "a", "And of Italy?")
    chat(gw, "b", "Name a river.")
    assert hops == []
    assert [r.call_index for r in gw.records("a")] == [0, 1] and len(gw.records("b")) == 1


def test_new_tools_and_long_new_text_still_go_off_the_loop(gateway, scripted, hops):
    gw = gateway(scripted(["ok"] * 5))
    chat(gw, "t", "Look around.", TOOLS)  # tools never seen: their schemas are checked on a worker thread
    assert any("parse_request" in h for h in hops), hops
    hops.clear()
    chat(gw, "t2", "Look again.", TOOLS)  # the same tools again: already valid, parsed on the loop
    assert hops == []
    words = " ".join(f"w{i}x{i * 7 % 13}" for i in range(400))  # ~3k characters the tokenizer has not seen
    chat(gw, "long", words)
    assert any("_prompt_request" in h for h in hops), hops
    hops.clear()
    chat(gw, "stops", "Short.", stop=[f"{c}" * 500 for c in "abc"])  # 1,500 characters of stop strings
    assert any("_prompt_request" in h for h in hops), hops
    big = "y " * 40_000  # a body over 64 KiB is parsed off the loop as well (then refused: too many tokens)
    hops.clear()
    chat(gw, "big", big, status=400)
    assert hops and "lambda" in hops[0], hops
    assert all(len(gw.records(s)) == 1 for s in ("t", "t2", "long", "stops"))
