"""Fixtures for the coding-CLI preset tests: the CLIs (installed with ``make harnesses`` when missing),
a real gateway on loopback around a chosen engine, and a session pipeline that runs a preset on a
swe_mini task and grades it."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.errors import HarnessError
from polar.harness.agent.presets import get_preset

ROOT = Path(__file__).resolve().parents[4]
SWE_MINI = ROOT / "examples" / "swe_mini"
_INSTALL: dict[str, Any] = {}


def ensure_cli(name: str) -> str:
    """Path of the preset's CLI; runs ``make harnesses`` once if it is missing (skip without npm)."""
    preset = get_preset(name)
    try:
        return preset.resolve_binary()
    except HarnessError:
        pass
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip(f"{preset.package} is not installed and Node 20+/npm are not available to install it")
    if "done" not in _INSTALL:
        res = subprocess.run(["make", "harnesses"], cwd=ROOT, capture_output=True, text=True, timeout=900)
        _INSTALL["done"] = res
    res = _INSTALL["done"]
    assert res.returncode == 0, f"make harnesses failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    return preset.resolve_binary()


@pytest.fixture(scope="session")
def cli() -> Callable[[str], str]:
    """``cli(preset)``: the preset's CLI path, installed with ``make harnesses`` when missing."""
    return ensure_cli


@pytest.fixture(scope="session")
def swe_mini_dir() -> Path:
    return SWE_MINI


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    from polar.inference.tiny import build_tiny

    return build_tiny(0)


@pytest.fixture(scope="session")
def swe_tasks() -> dict[str, dict[str, Any]]:
    import sys

    sys.path.insert(0, str(SWE_MINI))
    try:
        import swe_grader
    finally:
        sys.path.remove(str(SWE_MINI))
    return {t["id"]: t for t in swe_grader.load_tasks(SWE_MINI / "tasks.jsonl")}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``gateway(engine, **config)``: a started GatewayServer on a free loopback port."""
    from polar.config.gateway import GatewayConfig
    from polar.gateway.server import GatewayServer

    servers: list[Any] = []

    def start(engine: Any, **config: Any) -> Any:
        gw = GatewayServer(GatewayConfig(**config), engine=engine, records_dir=tmp_path / f"records{len(servers)}")
        servers.append(gw.start())
        return gw

    yield start
    for gw in servers:
        gw.stop()


@pytest.fixture
def scripted_gateway(gateway: Callable[..., Any], tiny: tuple[Any, Any]) -> Any:
    """A started gateway whose engine answers every call with "ok"."""
    from polar.inference.scripted import ScriptedEngine

    model, tokenizer = tiny
    return gateway(ScriptedEngine(tokenizer, lambda r, i: "ok", model=model, model_name="tiny"), default_max_tokens=16)


@pytest.fixture
def run_session(tmp_path: Path) -> Callable[..., Any]:
    """``run_session(gw, preset, task, options, agent_timeout_s)``: one session through the real pipeline
    (INIT → preset in its sandbox → gateway records → trajectory → swe_grader verifier)."""
    from polar.config.agentic import VerifierConfig
    from polar.config.harness import AgentHarnessConfig
    from polar.harness.agent.build import build_runner
    from polar.harness.agent.verifiers import build_verifier
    from polar.rollout.sessions.nodes import NodeRegistry
    from polar.rollout.sessions.pipeline import PipelineSettings, SessionPipeline
    from polar.rollout.sessions.session import SessionSpec

    def run(gw: Any, preset: str, task: dict[str, Any], options: dict[str, Any] | None = None,
            agent_timeout_s: float = 90.0, builder: str = "prefix_merging") -> Any:
        cfg = AgentHarnessConfig(type="agent", preset=preset, preset_options=options or {})
        runner = build_runner(cfg, config_dir=SWE_MINI)
        verifier = build_verifier(VerifierConfig(type="swe_grader:grade"), config_dir=SWE_MINI)
        settings = PipelineSettings(agent_timeout_s=agent_timeout_s, session_budget_s=agent_timeout_s + 120,
                                    model_name=gw.engine.model_name, builder=builder,
                                    workspace_root=str(tmp_path / "sessions"))

        async def go() -> Any:
            registry = NodeRegistry()
            registry.register("local", gw.url, static=True, server=gw)
            pipeline = SessionPipeline(runner, verifier, registry, settings)
            try:
                spec = SessionSpec(session_id=f"{preset}-{uuid.uuid4().hex[:8]}", task=task, task_id=task["id"])
                return await pipeline.submit(spec)
            finally:
                await pipeline.aclose()

        return asyncio.run(go())

    return run
