"""``PresetRunner``: runs one coding CLI for one session, inside the session's sandbox.

Plugs into the session pipeline as a :class:`polar.harness.agent.runners.HarnessRunner` (built by
:func:`polar.harness.agent.build.build_runner` from ``harness: {type: agent, preset: ...}``):

1. INIT of the sandbox: the task's ``repo`` (if any) is copied into the session workspace and
   committed as the diff baseline; a private HOME is made next to it;
2. the preset writes its config files and builds argv/env for the gateway URL the sandbox exposes;
3. :func:`polar.harness.agent.process.run_process` runs it under limits, stdin closed (a CLI that wants a
   human gets EOF), and kills every process it started;
4. the preset reads the CLI's final answer and transcript; the outcome carries the workspace diff,
   the transcript, and on failure the reason with the CLI's last output lines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

from polar.errors import HarnessError, PolarError
from polar.harness.agent.presets.base import HarnessPreset, PresetContext, harnesses_dir, last_lines
from polar.harness.agent.process import ProcessLimits, run_process
from polar.harness.agent.runners import HarnessOutcome, HarnessRunner, SessionContext, task_prompt
from polar.harness.agent.sandbox import Sandbox, SandboxOptions, check_runtime
from polar.harness.agent.session_relay import SessionRelay

log = logging.getLogger(__name__)

#: Output that means the CLI wants a human to log in (it never will inside a session).
LOGIN_PATTERNS = re.compile(
    r"(/login\b|please (log|sign) ?in|not logged in|invalid api key|authenticat(e|ion) (required|failed)|"
    r"select an auth|choose an? auth|OPENAI_API_KEY (is )?not set|missing api key)",
    re.IGNORECASE,
)
TRANSCRIPT_CAP_BYTES = 4 * 1024 * 1024


class PresetRunner(HarnessRunner):
    """Run ``preset`` per session. ``options`` is ``harness.preset_options`` (incl. ``sandbox``)."""

    def __init__(self, preset: HarnessPreset, options: dict[str, Any] | None = None, *,
                 limits: ProcessLimits | None = None, config_dir: Path | None = None) -> None:
        self.preset = preset
        options = dict(options or {})
        self.sandbox_options = SandboxOptions.from_dict(options.pop("sandbox", None))
        # one runner per run: a sandbox that cannot work fails here; one that falls back says so, once
        cli = preset.name + (f" ({preset.binary} {preset.permission_flag})" if preset.permission_flag
                             else f" ({preset.binary}, which runs its tools without asking)")
        check_runtime(self.sandbox_options, cli)
        self.options = options
        preset.check_options(options)
        # Node reserves far more address space than it uses; an RLIMIT_AS that suits Python kills it.
        self.limits = limits or ProcessLimits(memory_mb=0)
        self.config_dir = config_dir

    def _repo(self, task: dict[str, Any]) -> Path | None:
        repo = task.get("repo")
        if not repo:
            return None
        path = Path(repo).expanduser()
        if not path.is_absolute():
            base = Path(self.options.get("tasks_root") or self.config_dir or Path.cwd())
            path = base / path
        return path

    async def run(self, ctx: SessionContext, timeout_s: float, cancel: asyncio.Event) -> HarnessOutcome:
        name = self.preset.name
        try:
            sandbox = await asyncio.to_thread(
                Sandbox.create, ctx.session_id, Path(ctx.workspace), self._repo(ctx.task), self.sandbox_options
            )
        except (OSError, PolarError) as e:
            return HarnessOutcome(error=f"preset {name}: sandbox setup failed: {e}")
        # without bubblewrap's network (runtime none, network host) the CLI still gets no address but a relay
        # that passes only this session's model calls (the gateway's own locks hold behind it as well)
        relay = SessionRelay(ctx.gateway_url, ctx.session_id) if (
            not sandbox.isolated and ctx.gateway_url.startswith("http://")) else None
        try:
            if relay is not None:
                server = await relay.listen_tcp("127.0.0.1", 0)
                ctx = dataclasses.replace(ctx, gateway_url=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
            return await self._run_in(sandbox, ctx, timeout_s, cancel)
        finally:
            if relay is not None:
                await relay.aclose()
            await asyncio.to_thread(sandbox.cleanup)

    async def _run_in(self, sandbox: Sandbox, ctx: SessionContext, timeout_s: float, cancel: asyncio.Event) -> HarnessOutcome:
        name = self.preset.name
        pctx = PresetContext(
            session_id=ctx.session_id, gateway_url=sandbox.gateway_url(ctx.gateway_url), model=ctx.model,
            instruction=task_prompt(ctx.task), workspace=Path(ctx.workspace), home=sandbox.home,
            options={k: v for k, v in self.options.items() if k != "tasks_root"}, key=ctx.api_key,
        )
        try:
            spec = self.preset.launch(pctx)
        except HarnessError as e:  # e.g. the CLI is not installed: names the install command
            return HarnessOutcome(error=str(e), details={"preset": name})
        binary_root = _install_root(spec.argv[0])
        argv = sandbox.wrap(spec.argv, ro_paths=[binary_root])
        try:
            await asyncio.to_thread(sandbox.start, ctx.gateway_url)
        except (OSError, PolarError) as e:
            await asyncio.to_thread(sandbox.stop)
            return HarnessOutcome(error=f"preset {name}: could not open the sandbox's route to the gateway: {e}")
        try:
            res = await run_process(argv, cwd=str(spec.cwd), env=spec.env, stdin=None, timeout_s=timeout_s,
                                    limits=self.limits, cancel=cancel)
        except (FileNotFoundError, PermissionError) as e:
            return HarnessOutcome(error=f"preset {name}: {argv[0]!r} could not start: {e}")
        finally:
            await asyncio.to_thread(sandbox.stop)
        collected = self.preset.collect(pctx, res.stdout, res.stderr)
        tail = collected.last_lines or last_lines(res.stderr + b"\n" + res.stdout)
        diff = await asyncio.to_thread(_safe_diff, sandbox)
        details: dict[str, Any] = {
            "preset": name,
            "cli": f"{self.preset.package}@{self.preset.version}",
            "sandbox": sandbox.report,
            "duration_s": round(res.duration_s, 3),
            "leftover_pids": res.leftover_pids,
            "diff": diff,
            "transcript": _cap(collected.transcript),
            "transcript_files": _read_transcripts(collected.transcript_files),
            "last_lines": tail,
        }
        out = HarnessOutcome(
            output=collected.final_text, returncode=res.returncode, timed_out=res.timed_out,
            cancelled=res.cancelled, stderr_tail="\n".join(tail), details=details,
        )
        shown = "\n".join(tail[-10:]) or "(no output)"
        if res.output_exceeded:
            out.error = f"preset {name}: the CLI wrote more than {self.limits.output_bytes} bytes; it was killed. Last lines:\n{shown}"
        elif res.timed_out:
            details["timeout_reason"] = f"preset {name}: the CLI ran past its {timeout_s:g}s budget and was killed. Last lines:\n{shown}"
        elif res.cancelled:
            pass
        elif res.returncode != 0:
            why = "asked for an interactive login" if LOGIN_PATTERNS.search("\n".join(tail)) else (
                f"exited with code {res.returncode}" + (f" (signal {-res.returncode})" if res.returncode is not None
                                                        and res.returncode < 0 else ""))
            out.error = f"preset {name}: the CLI {why}. Last lines:\n{shown}"
        elif res.leftover_pids:
            log.info("preset %s left %d process(es) behind; they were killed", name, len(res.leftover_pids))
        return out


def _install_root(binary: str) -> str:
    """The folder to expose read-only for a CLI: the ``.harnesses`` install, or the binary's package."""
    path = Path(binary).resolve()
    root = harnesses_dir().resolve()
    if root in path.parents:
        return str(root)
    for parent in path.parents:
        if parent.name == "node_modules":
            return str(parent)
    return str(path.parent)


def _safe_diff(sandbox: Sandbox) -> str:
    try:
        return sandbox.diff()
    except HarnessError as e:
        log.warning("%s", e)
        return ""


def _cap(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import json

    out, size = [], 0
    for ev in events:
        size += len(json.dumps(ev, default=str))
        if size > TRANSCRIPT_CAP_BYTES:
            out.append({"type": "polar.truncated", "reason": f"transcript over {TRANSCRIPT_CAP_BYTES} bytes"})
            break
        out.append(ev)
    return out


def _read_transcripts(paths: list[str]) -> dict[str, str]:
    """The CLI's own session files (read before the sandbox folder is removed), capped in size."""
    out: dict[str, str] = {}
    budget = TRANSCRIPT_CAP_BYTES
    for p in paths:
        try:
            data = Path(p).read_bytes()[:budget]
        except OSError:
            continue
        budget -= len(data)
        out[Path(p).name] = data.decode("utf-8", "replace")
        if budget <= 0:
            break
    return out
