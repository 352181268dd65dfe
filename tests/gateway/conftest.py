"""Fixtures: one tiny model per test session, and real gateways on 127.0.0.1 around chosen engines."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from polar.config.gateway import GatewayConfig
from polar.gateway.server import GatewayServer


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    """(model, tokenizer) of the tiny preset, built once."""
    from polar.inference.tiny import build_tiny

    return build_tiny(0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny: tuple[Any, Any]) -> Any:
    return tiny[1]


@pytest.fixture
def embedded(tiny: tuple[Any, Any]) -> Any:
    """The real embedded engine over the tiny model (a fresh engine; the weights are shared)."""
    from polar.inference.embedded import EmbeddedEngine

    model, tokenizer = tiny
    return EmbeddedEngine(model, tokenizer, model_name="tiny")


@pytest.fixture
def scripted(tiny: tuple[Any, Any]) -> Callable[..., Any]:
    """``scripted(responses)``: a ScriptedEngine on the tiny tokenizer with real tiny-model logprobs."""
    from polar.inference.scripted import ScriptedEngine

    model, tokenizer = tiny

    def make(responses: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("model_name", "tiny")
        return ScriptedEngine(tokenizer, responses, model=model, **kwargs)

    return make


@pytest.fixture
def gateway(tmp_path: Any) -> Iterator[Callable[..., GatewayServer]]:
    """``gateway(engine, **config)``: a started GatewayServer on a free loopback port, stopped after the test."""
    servers: list[GatewayServer] = []

    def start(engine: Any, **config: Any) -> GatewayServer:
        records = tmp_path / f"records{len(servers)}"
        gw = GatewayServer(GatewayConfig(**config), engine=engine, records_dir=records).start()
        servers.append(gw)
        return gw

    yield start
    for gw in servers:
        gw.stop()
