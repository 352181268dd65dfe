"""Presets under bad input: a CLI that is missing, crashes at start, wants an interactive login, or runs
past its budget ends the session ERROR/TIMEOUT with the reason and its last output lines; nothing it
started survives; inside bubblewrap it reaches the gateway and nothing else.

Stand-in CLIs are small scripts passed as ``preset_options.bin`` (the preset's real flags, env and
config files are still used); the login case uses the real Claude Code binary.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from polar.errors import ConfigError
from polar.harness.agent.presets import PRESETS, get_preset
from polar.harness.agent.sandbox import _bwrap_works as bwrap_works
from polar.harness.agent.sandbox import bwrap_path
from polar.rollout.sessions.session import SessionStatus


def script(tmp_path: Path, body: str, shebang: str = "#!/bin/sh") -> str:
    path = tmp_path / f"fake-cli-{uuid.uuid4().hex[:6]}"
    path.write_text(f"{shebang}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp_path.chmod(0o755)
    return str(path)


def survivors(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_unknown_preset_names_the_presets() -> None:
    with pytest.raises(ConfigError, match="did you mean: claude_code") as e:
        get_preset("claude-code")
    assert "codex" in str(e.value) and "gemini_cli" in str(e.value)


def test_missing_cli_is_an_error_naming_the_install_command(scripted_gateway: Any, run_session: Any,
                                                            swe_tasks: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_HARNESSES_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    result = run_session(scripted_gateway, "codex", swe_tasks["median"])
    assert result.status == SessionStatus.ERROR
    assert "not installed" in result.error and "make harnesses" in result.error
    assert "@openai/codex@0.171.0" in result.error


def test_cli_crashing_at_start_is_an_error_with_its_last_lines(scripted_gateway: Any, run_session: Any,
                                                               swe_tasks: Any, tmp_path: Path) -> None:
    fake = script(tmp_path, 'echo "loading config" ; echo "fatal: cannot parse settings.json" >&2 ; exit 3')
    result = run_session(scripted_gateway, "gemini_cli", swe_tasks["median"], {"bin": fake})
    assert result.status == SessionStatus.ERROR
    assert "exited with code 3" in result.error and "fatal: cannot parse settings.json" in result.error
    assert scripted_gateway.records(result.session_id) == []


def test_cli_past_its_budget_times_out_and_leaves_no_process(scripted_gateway: Any, run_session: Any,
                                                             swe_tasks: Any, tmp_path: Path) -> None:
    marker = f"{3000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    # a child in its own session (escapes a plain process-group kill) and a foreground sleep
    fake = script(tmp_path, f'echo "thinking hard" ; setsid sleep {marker} & sleep {marker}')
    # the CLI sleeps ~3000 s; the budget leaves a loaded machine time to start the sandbox and print the line
    result = run_session(scripted_gateway, "pi", swe_tasks["median"], {"bin": fake}, agent_timeout_s=20)
    assert result.status == SessionStatus.TIMEOUT
    assert "timed out" in result.error and "thinking hard" in result.error
    assert survivors(marker) == []


@pytest.mark.cli
def test_cli_asking_for_interactive_login_is_an_error(scripted_gateway: Any, run_session: Any, swe_tasks: Any,
                                                      cli: Any) -> None:
    cli("claude_code")
    result = run_session(scripted_gateway, "claude_code", swe_tasks["median"],
                         {"compact": True, "extra_env": {"ANTHROPIC_API_KEY": ""}})
    assert result.status == SessionStatus.ERROR
    assert "interactive login" in result.error and "/login" in result.error


def _listener() -> tuple[socket.socket, int, list[bytes]]:
    """A plain TCP server on loopback that records whatever connects: the sandbox must not reach it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    got: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            got.append(conn.recv(100))
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1], got


PROBE = """
import json, os, socket, urllib.request
base = os.environ["ANTHROPIC_BASE_URL"]
body = json.dumps({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()
req = urllib.request.Request(base + "/v1/messages", body, {"content-type": "application/json",
                             "x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01"})
out = {"gateway": json.loads(urllib.request.urlopen(req, timeout=30).read())["type"]}
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
out["host_port"] = reach("127.0.0.1", int(os.environ["PROBE_PORT"]))
out["internet"] = reach("1.1.1.1", 443)
out["uid"] = os.getuid()
print(json.dumps({"type": "result", "result": json.dumps(out)}))
"""


@pytest.mark.skipif(bwrap_path() is None or not bwrap_works(bwrap_path() or "bwrap"),
                    reason="bubblewrap is not installed or cannot create namespaces here")
def test_bwrap_sandbox_reaches_the_gateway_and_nothing_else(scripted_gateway: Any, run_session: Any,
                                                            swe_tasks: Any, tmp_path: Path) -> None:
    srv, port, got = _listener()
    try:
        probe = script(tmp_path, PROBE, shebang="#!/usr/bin/python3")
        result = run_session(scripted_gateway, "claude_code", swe_tasks["median"],
                             {"bin": probe, "extra_env": {"PROBE_PORT": str(port)}})
    finally:
        srv.close()
    assert result.status == SessionStatus.DONE, result.error
    seen = json.loads(result.output)
    assert seen["gateway"] == "message"  # the gateway answered through the sandbox's only route
    assert seen["host_port"] != "connected" and got == []
    assert seen["internet"] != "connected"
    if os.geteuid() == 0:
        assert seen["uid"] == 65534  # root drops to nobody inside the sandbox
    assert len(scripted_gateway.records(result.session_id)) == 1


def test_makefile_pins_exactly_the_preset_versions() -> None:
    makefile = (Path(__file__).resolve().parents[4] / "Makefile").read_text()
    block = makefile.split("HARNESS_PKGS :=", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    assert sorted(block.split()) == sorted(f"{p.package}@{p.version}" for p in PRESETS.values())
