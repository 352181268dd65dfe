"""What every coding-CLI preset shares: the launch context, the launch spec, and the collected output.

A preset turns (task, session, gateway URL, served model) into a command line, an environment built
from scratch (never the host's: no stray real API keys reach the CLI), and config files written into
the session's private HOME. After the run it reads the CLI's own transcript and final answer back.
The preset never runs anything itself: the agentic runner (or :mod:`polar.harness.agent.sandbox`) does.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from polar.errors import HarnessError

#: System prompt used with ``preset_options.compact`` (overridable with ``system_prompt``).
COMPACT_SYSTEM_PROMPT = (
    "You are a coding agent working in the current directory. Use the shell tool to inspect the code, "
    "fix the problem described by the user, and stop when the tests pass."
)

#: Folder (relative to the repo root, or $POLAR_HARNESSES_DIR) where ``make harnesses`` installs the CLIs.
HARNESSES_DIR = Path(__file__).resolve().parents[4] / ".harnesses"  # polar/harness/agent/presets/ -> repo


def harnesses_dir() -> Path:
    return Path(os.environ.get("POLAR_HARNESSES_DIR") or HARNESSES_DIR)


@dataclass
class PresetContext:
    """Everything a preset needs to know about one session.

    ``gateway_url`` is the gateway's root as the CLI will see it (inside a network-isolated sandbox
    this is the loopback relay, not the host address); the preset adds the ``/s/{session_id}`` prefix.
    """

    session_id: str
    gateway_url: str
    model: str
    instruction: str
    workspace: Path
    home: Path
    options: dict[str, Any] = field(default_factory=dict)
    #: the session's secret gateway key (``polar.types.new_session_key``); None: an open name (no credential)
    key: str | None = None

    @property
    def base_url(self) -> str:
        return f"{self.gateway_url.rstrip('/')}/s/{self.session_id}"

    @property
    def api_key(self) -> str:
        """The session's key: it names the session, so a CLI that drops the URL prefix still routes, and
        (from a rollout) it is the secret that owns the session at the gateway."""
        from polar.types import session_key

        return self.key or session_key(self.session_id)


@dataclass
class LaunchSpec:
    """A fully resolved command: what to exec, with which environment, in which directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    stdin: bytes | None = None
    written: list[Path] = field(default_factory=list)  # config files the preset wrote (for docs/tests)


@dataclass
class PresetOutput:
    """What the verifier and the trajectory metadata get from a finished CLI run."""

    final_text: str
    transcript: list[dict[str, Any]]
    transcript_files: list[str]
    last_lines: list[str]


def last_lines(data: bytes | str, n: int = 20, width: int = 400) -> list[str]:
    """The CLI's last ``n`` non-empty output lines (each cut to ``width`` chars): what an
    ERROR/TIMEOUT reason shows the user."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()][-n:]
    return [ln if len(ln) <= width else ln[: width - 3] + "..." for ln in lines]


def parse_jsonl(data: bytes | str) -> list[dict[str, Any]]:
    """Parse JSON-lines output, skipping non-JSON lines (banners, warnings)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            events.append(obj)
    return events


def write_file(path: Path, content: str | dict[str, Any], written: list[Path]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(content, indent=2) if isinstance(content, dict) else content
    path.write_text(text)
    written.append(path)
    return path


class HarnessPreset:
    """One coding CLI. Subclasses set the class attributes and implement ``command``/``env``/``collect``."""

    name: ClassVar[str]
    package: ClassVar[str]  # npm package
    version: ClassVar[str]  # pinned, verified version
    binary: ClassVar[str]  # name in node_modules/.bin
    api: ClassVar[str]  # gateway provider the CLI speaks: anthropic | openai_responses | openai_chat | gemini
    streams: ClassVar[bool] = True
    #: model names the CLI may request on its own (utility/sub-agent calls) that cannot be pinned by
    #: env or config; the gateway must alias these to the served model.
    extra_model_names: ClassVar[tuple[str, ...]] = ()
    #: options a user may pass in ``preset_options`` (besides ``bin`` and ``extra_args``).
    option_names: ClassVar[tuple[str, ...]] = ()
    #: the flag that turns the CLI's own permission prompts off (named when it runs without a sandbox).
    permission_flag: ClassVar[str] = ""

    # -- resolution ---------------------------------------------------------------------------
    @classmethod
    def install_command(cls) -> str:
        return f"make harnesses  (or: npm install --no-audit --no-fund --prefix .harnesses {cls.package}@{cls.version})"

    @classmethod
    def resolve_binary(cls, options: dict[str, Any] | None = None) -> str:
        """Find the CLI: ``preset_options.bin``, then the ``.harnesses`` folder, then PATH."""
        options = options or {}
        explicit = options.get("bin")
        if explicit:
            if Path(explicit).is_file() and os.access(explicit, os.X_OK):
                return str(Path(explicit).resolve())
            raise HarnessError(
                f"preset {cls.name!r}: preset_options.bin={explicit!r} is not an executable file; "
                f"fix the path or drop it to use the installed CLI ({cls.install_command()})"
            )
        local = harnesses_dir() / "node_modules" / ".bin" / cls.binary
        if local.exists():
            return str(local.resolve())
        found = shutil.which(cls.binary)
        if found:
            return found
        raise HarnessError(
            f"preset {cls.name!r}: the {cls.package} CLI ({cls.binary!r}) is not installed "
            f"(looked in {local.parent} and on PATH); install it with: {cls.install_command()}"
        )

    def check_options(self, options: dict[str, Any]) -> None:
        known = {"bin", "extra_args", "extra_env", "compact", "system_prompt", "max_output_tokens", "tasks_root",
                 *self.option_names}
        unknown = sorted(set(options) - known)
        if unknown:
            from polar.config.base import did_you_mean

            bad = unknown[0]
            raise HarnessError(
                f"preset {self.name!r}: unknown preset_options key {bad!r}{did_you_mean(bad, known)}; "
                f"valid keys: {', '.join(sorted(known))}"
            )

    # -- launch -------------------------------------------------------------------------------
    def base_env(self, ctx: PresetContext) -> dict[str, str]:
        """A clean environment: PATH to node, a private HOME and TMPDIR, no telemetry, no host secrets."""
        node_dir = str(Path(shutil.which("node") or "/usr/bin/node").parent)
        path = os.pathsep.join(dict.fromkeys([node_dir, "/usr/local/bin", "/usr/bin", "/bin"]))
        tmp = ctx.home / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return {
            "PATH": path,
            "HOME": str(ctx.home),
            "USER": "polar",
            "LOGNAME": "polar",
            "TMPDIR": str(tmp),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_COLOR": "1",
            "CI": "1",
            "NO_UPDATE_NOTIFIER": "1",
            "NPM_CONFIG_UPDATE_NOTIFIER": "false",
            "DO_NOT_TRACK": "1",
            "POLAR_SESSION_ID": ctx.session_id,
        }

    def launch(self, ctx: PresetContext) -> LaunchSpec:
        """Resolve the binary, write per-session config files, and build argv + env."""
        self.check_options(ctx.options)
        binary = self.resolve_binary(ctx.options)
        ctx.home.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        env = self.base_env(ctx)
        env.update(self.env(ctx))
        self.write_config(ctx, written)
        env.update({str(k): str(v) for k, v in (ctx.options.get("extra_env") or {}).items()})
        argv = [binary, *self.args(ctx), *[str(a) for a in ctx.options.get("extra_args") or []]]
        argv += self.prompt_args(ctx)
        return LaunchSpec(argv=argv, env=env, cwd=ctx.workspace, stdin=None, written=written)

    def args(self, ctx: PresetContext) -> list[str]:
        raise NotImplementedError

    def prompt_args(self, ctx: PresetContext) -> list[str]:
        return [ctx.instruction]

    def env(self, ctx: PresetContext) -> dict[str, str]:
        raise NotImplementedError

    def write_config(self, ctx: PresetContext, written: list[Path]) -> None:
        """Write the CLI's per-session config files under ``ctx.home`` (default: none)."""

    @staticmethod
    def compact(ctx: PresetContext) -> bool:
        """``preset_options.compact``: shrink the CLI's own system prompt and tool list with its own
        flags, so its prompts fit a small context window (the ``tiny`` test model has 4k tokens)."""
        return bool(ctx.options.get("compact"))

    @staticmethod
    def system_prompt(ctx: PresetContext) -> str:
        return str(ctx.options.get("system_prompt") or COMPACT_SYSTEM_PROMPT)

    @staticmethod
    def max_output_tokens(ctx: PresetContext) -> int | None:
        v = ctx.options.get("max_output_tokens")
        return int(v) if v is not None else None

    # -- after the run ------------------------------------------------------------------------
    def collect(self, ctx: PresetContext, stdout: bytes, stderr: bytes) -> PresetOutput:
        raise NotImplementedError

    def transcript_globs(self) -> tuple[str, ...]:
        """Globs under HOME where the CLI keeps its own session transcript."""
        return ()

    def find_transcripts(self, ctx: PresetContext) -> list[str]:
        found: list[str] = []
        for pattern in self.transcript_globs():
            found += sorted(str(p) for p in ctx.home.glob(pattern) if p.is_file())
        return found
