"""The public API: what ``polar``, ``polar.inference``, ``polar.gateway`` and ``polar.harness`` export imports,
is the object the docs name, and every ``from polar... import`` line in the docs and examples works."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# name -> module that defines it (what the README and docs call it)
POLAR = {
    "AgentBase": "polar.agents",
    "Connector": "polar.harness.connector",
    "make_env": "polar.harness",
    "make_vector_env": "polar.harness",
    "load_config": "polar.config.loader",
    "RunConfig": "polar.config.run",
    "EnvRunConfig": "polar.config.run",
    "AgentRunConfig": "polar.config.run",
    "PolarError": "polar.errors",
    "ConfigError": "polar.errors",
}


def test_polar_exports_the_curated_api():
    import polar

    assert set(polar.__all__) == {*POLAR, "__version__"}
    assert isinstance(polar.__version__, str) and polar.__version__
    for name, module in POLAR.items():
        obj = getattr(polar, name)
        assert obj is getattr(importlib.import_module(module), name), name
    assert issubclass(polar.ConfigError, polar.PolarError)
    assert inspect.isclass(polar.AgentBase) and inspect.isclass(polar.Connector)
    with pytest.raises(AttributeError, match="module 'polar' has no attribute 'Trainer'"):
        polar.Trainer  # noqa: B018


def test_import_polar_stays_light():
    """``import polar`` loads no torch, no gateway, no trainers: the API resolves lazily."""
    code = ("import sys, polar; heavy = [m for m in ('torch', 'transformers', 'polar.gateway', 'polar.trainers', "
            "'polar.config') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("package", "names"), [
    ("polar.inference", {"ContextLengthExceeded", "Engine", "EngineError", "GenerationRequest", "GenerationResult",
                         "TokenEvent", "UpstreamUnavailable", "collect", "load_engine", "EmbeddedEngine",
                         "ScriptedEngine", "UpstreamEngine", "UpstreamConfig", "build_tiny", "build_tiny_tokenizer"}),
    ("polar.gateway", {"GatewayApp", "GatewayServer", "build_app"}),
    ("polar.harness", {"make_env", "make_vector_env"}),
])
def test_package_exports_resolve(package, names):
    mod = importlib.import_module(package)
    assert set(mod.__all__) == names
    for name in names:
        assert getattr(mod, name) is not None, f"{package}.{name}"
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018


def test_gateway_exports_are_the_server_and_app():
    from polar import gateway
    from polar.gateway.app import GatewayApp
    from polar.gateway.server import GatewayServer, build_app

    assert (gateway.GatewayServer, gateway.build_app, gateway.GatewayApp) == (GatewayServer, build_app, GatewayApp)


def _doc_imports() -> list[tuple[str, str, list[str]]]:
    found = []
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
    for doc in docs:
        for m in re.finditer(r"^\s*from (polar[\w.]*) import ([\w, ]+)$", doc.read_text(), re.M):
            found.append((doc.relative_to(ROOT).as_posix(), m.group(1), [n.strip() for n in m.group(2).split(",")]))
    return found


DOC_IMPORTS = _doc_imports()


def test_the_docs_import_from_polar():
    assert any(module == "polar" for _, module, _ in DOC_IMPORTS)


@pytest.mark.parametrize(("doc", "module", "names"), DOC_IMPORTS, ids=[f"{d}:{m}" for d, m, _ in DOC_IMPORTS])
def test_every_import_the_docs_show_works(doc, module, names):
    mod = importlib.import_module(module)
    for name in names:
        assert hasattr(mod, name), f"{doc}: `from {module} import {name}` fails"


def test_package_ships_py_typed():
    """PEP 561: ``polar/py.typed`` exists and the package data ships it, so type checkers of user code read
    polar's annotations instead of treating it as untyped."""
    import tomllib

    assert (ROOT / "polar" / "py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data.get("polar", [])
