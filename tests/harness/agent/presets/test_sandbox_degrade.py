"""The sandbox never degrades silently (issue 12): with ``runtime: auto`` and no usable bubblewrap the CLIs run
with no isolation, and the run says so once; ``runtime: bwrap`` that cannot work fails when the runner is
built (the start of a run), not session by session. "No bubblewrap" is a PATH without it; "bubblewrap that
cannot create namespaces" is a ``bwrap`` on PATH that fails the way a locked-down container's does."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest

from polar.config.harness import AgentHarnessConfig
from polar.errors import HarnessError
from polar.rollout.sessions.session import SessionStatus
from tests.harness.agent.presets.conftest import SWE_MINI

WARNING = "runs with no isolation"


def path_without_bwrap(tmp_path: Path) -> str:
    """A PATH holding every tool of /usr/bin and /bin (git, setpriv, sh, ...) except bwrap."""
    bin_dir = tmp_path / "bin-no-bwrap"
    bin_dir.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        if not Path(folder).is_dir():
            continue
        for entry in os.scandir(folder):
            target = bin_dir / entry.name
            if entry.name != "bwrap" and not target.exists():
                target.symlink_to(entry.path)
    return str(bin_dir)


def executable(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    path.parent.chmod(0o755)
    return str(path)


def broken_bwrap(tmp_path: Path) -> str:
    """PATH with a ``bwrap`` that fails like one without user namespaces, then everything else."""
    folder = tmp_path / "bin-broken-bwrap"
    folder.mkdir()
    executable(folder / "bwrap", 'echo "bwrap: No permissions to creating new namespace" >&2; exit 1')
    return f"{folder}{os.pathsep}{path_without_bwrap(tmp_path)}"


def runner(preset: str, sandbox: dict[str, Any] | None = None, **options: Any):
    from polar.harness.agent.build import build_runner

    opts = {**options, **({"sandbox": sandbox} if sandbox is not None else {})}
    return build_runner(AgentHarnessConfig(type="agent", preset=preset, preset_options=opts), config_dir=SWE_MINI)


def sandbox_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and WARNING in r.getMessage()]


@pytest.mark.parametrize("preset,flag", [("claude_code", "--dangerously-skip-permissions"), ("gemini_cli", "--yolo"),
                                         ("qwen_code", "--yolo")])
def test_auto_without_bwrap_warns_once_per_run(preset: str, flag: str, scripted_gateway: Any, swe_tasks: Any,
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Two sessions of one run (one runner) on a machine without bubblewrap: one warning, naming the CLI's
    permission flag and how to fix or accept it; both sessions run, unisolated, as the report says."""
    from polar.config.agentic import VerifierConfig
    from polar.harness.agent.verifiers import build_verifier
    from polar.rollout.sessions.nodes import NodeRegistry
    from polar.rollout.sessions.pipeline import PipelineSettings, SessionPipeline
    from polar.rollout.sessions.session import SessionSpec

    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path))
    fake = executable(tmp_path / f"fake-{preset}", 'echo \'{"type": "result", "result": "done"}\'')
    with caplog.at_level(logging.WARNING):
        run_runner = runner(preset, bin=fake)  # default sandbox: {runtime: auto}
        verifier = build_verifier(VerifierConfig(type="swe_grader:grade"), config_dir=SWE_MINI)
        settings = PipelineSettings(agent_timeout_s=60, session_budget_s=180, model_name="tiny",
                                    workspace_root=str(tmp_path / "sessions"))

        async def two_sessions() -> list[Any]:
            registry = NodeRegistry()
            registry.register("local", scripted_gateway.url, static=True, server=scripted_gateway)
            pipeline = SessionPipeline(run_runner, verifier, registry, settings)
            try:
                specs = [SessionSpec(session_id=f"{preset}-{uuid.uuid4().hex[:8]}", task=swe_tasks["median"],
                                     task_id="median") for _ in range(2)]
                return list(await asyncio.gather(*(pipeline.submit(s) for s in specs)))
            finally:
                await pipeline.aclose()

        results = asyncio.run(two_sessions())
    for result in results:
        assert result.status != SessionStatus.ERROR or "sandbox" not in (result.error or ""), result.error
    warnings = sandbox_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert preset in warnings[0] and flag in warnings[0]
    assert "bubblewrap is not installed" in warnings[0] and "apt-get install -y bubblewrap" in warnings[0]
    assert "runtime: none" in warnings[0]


def test_runtime_none_is_a_choice_and_does_not_warn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path))
    with caplog.at_level(logging.WARNING):
        runner("claude_code", {"runtime": "none"})
    assert sandbox_warnings(caplog) == []


def test_runtime_bwrap_without_bwrap_fails_when_the_runner_is_built(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path))
    with pytest.raises(HarnessError, match="bubblewrap is not installed") as e:
        runner("codex", {"runtime": "bwrap"})
    assert "apt-get install -y bubblewrap" in str(e.value) and "runtime: none" in str(e.value)


def test_runtime_bwrap_that_cannot_create_namespaces_fails_when_the_runner_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PATH", broken_bwrap(tmp_path))
    with pytest.raises(HarnessError, match="cannot create namespaces") as e:
        runner("claude_code", {"runtime": "bwrap"})
    assert "No permissions to creating new namespace" in str(e.value)  # bwrap's own reason
    with caplog.at_level(logging.WARNING):
        runner("qwen_code")  # auto: runs unisolated, and says why
    warnings = sandbox_warnings(caplog)
    assert len(warnings) == 1 and "cannot create namespaces" in warnings[0] and "--yolo" in warnings[0]


def test_runtime_bwrap_that_works_builds_and_isolates(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Where bubblewrap works (CI installs it) the check passes and auto stays quiet."""
    from polar.harness.agent.sandbox import _bwrap_works, bwrap_path

    found = bwrap_path()
    if found is None or not _bwrap_works(found):
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    with caplog.at_level(logging.WARNING):
        runner("claude_code", {"runtime": "bwrap"})
        runner("claude_code")
    assert sandbox_warnings(caplog) == []
