"""polar.httpserver.ThreadedUvicorn: the one threaded uvicorn every polar server runs on."""

from __future__ import annotations

import socket

import uvicorn
from starlette.applications import Starlette

from polar.httpserver import ThreadedUvicorn


def test_after_runs_when_uvicorn_crashes() -> None:
    """``after`` closes what the server's owner opened on its loop (an engine); uvicorn failing to serve (here:
    a socket closed under it) must not skip it, or the engine outlives its server."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.close()  # uvicorn's serve() raises on it
    ran: list[str] = []

    async def after() -> None:
        ran.append("after")

    server = ThreadedUvicorn(uvicorn.Config(Starlette(), log_level="critical"), sock, "crashing", after=after,
                             cleanup=lambda: ran.append("cleanup"))
    assert not server.start(timeout_s=10)
    assert server.stop(timeout_s=10)
    assert ran == ["after", "cleanup"]


def test_after_runs_once_when_uvicorn_stops() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    ran: list[str] = []

    async def after() -> None:
        ran.append("after")

    server = ThreadedUvicorn(uvicorn.Config(Starlette(), log_level="critical"), sock, "fine", after=after)
    assert server.start(timeout_s=10)
    assert server.stop(timeout_s=10)
    assert ran == ["after"]
