"""Record what each coding CLI really sends, as JSON fixtures for the gateway replay tests.

    .venv/bin/python -m tests.harness.agent.presets.capture_cli [--tool-first] [preset ...]

Runs each CLI once, with exactly the env/config its preset sets, on the ``median`` swe_mini task
against :class:`CaptureServer`; writes ``tests/harness/agent/presets/fixtures/<preset>.json``
(``<preset>_tool.json`` with ``--tool-first``: the first reply is a shell tool call that fixes the
task, so the CLI's follow-up request carries a tool result).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from polar.harness.agent.presets import PRESETS, PresetContext, get_preset
from tests.harness.agent.presets.capture_server import CaptureServer

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TASK = ROOT / "examples" / "swe_mini" / "tasks" / "median"
INSTRUCTION = json.loads((ROOT / "examples" / "swe_mini" / "tasks.jsonl").read_text().splitlines()[0])["instruction"]
SESSION = "ses-capture-0001"
MODEL = "tiny"


def capture(name: str, tool_first: bool, timeout_s: float = 120.0) -> dict:
    preset = get_preset(name)
    server = CaptureServer(tool_first=tool_first)
    url = server.start()
    tmp = Path(tempfile.mkdtemp(prefix=f"polar-capture-{name}-"))
    try:
        workspace = tmp / "workspace"
        shutil.copytree(TASK / "repo", workspace)
        ctx = PresetContext(SESSION, url, MODEL, INSTRUCTION, workspace, tmp / "home")
        spec = preset.launch(ctx)
        proc = subprocess.Popen(spec.argv, cwd=spec.cwd, env=spec.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        result = preset.collect(ctx, out, err)
        fixed = (workspace / "stats_lite" / "core.py").read_text() != (TASK / "repo" / "stats_lite" / "core.py").read_text()
        record = {
            "preset": name,
            "package": f"{preset.package}@{preset.version}",
            "session_id": SESSION,
            "model": MODEL,
            "base_url_placeholder": "http://127.0.0.1:PORT",
            "tool_first": tool_first,
            "workspace_changed": fixed,
            "returncode": proc.returncode,
            "final_text": result.final_text,
            "last_lines": result.last_lines,
            "transcript_files": [str(Path(p).relative_to(ctx.home)) for p in result.transcript_files],
            "requests": server.requests,
        }
        return json.loads(json.dumps(record).replace(url, "http://127.0.0.1:PORT").replace(str(tmp), "/SESSION"))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    tool_first = "--tool-first" in argv
    names = [a for a in argv if not a.startswith("--")] or list(PRESETS)
    for name in names:
        rec = capture(name, tool_first)
        stem = f"{name}_tool" if tool_first else name
        (FIXTURES / f"{stem}.json").write_text(json.dumps(rec, indent=1) + "\n")
        reqs = [f"{r['method']} {r['path']}" for r in rec["requests"]]
        sys.stderr.write(f"{name}: rc={rec['returncode']} final={rec['final_text'][:60]!r} requests={reqs} changed={rec['workspace_changed']}\n")
        if rec["returncode"] != 0:
            sys.stderr.write("  " + "\n  ".join(rec["last_lines"][-8:]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
