"""Harness runners: how one session's agent program is started, fed its task, and stopped.

Two kinds, one contract (:meth:`HarnessRunner.run` → :class:`HarnessOutcome`):

- :class:`CommandRunner`: any program (a CLI, a script in any language). It gets the gateway through
  the provider environment variables every official SDK reads, with the session's secret key as the API
  key, at a per-session relay address that passes only that session's model calls
  (:mod:`polar.harness.agent.session_relay`); the task arrives on stdin, in a file, or through
  ``{placeholders}`` in the command line. It runs in the same sandbox as the presets
  (:class:`~polar.harness.agent.sandbox.Sandbox`, ``harness.sandbox``): bubblewrap with a read-only system,
  its program read-only, only its workspace and a private HOME writable, and no network but its relay.
- :class:`CallableRunner`: a Python ``module:function`` (sync or async) called with ``base_url``,
  ``task`` and, if it asks for them, ``api_key``, ``workspace``, ``session_id``, ``model``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from polar.errors import ConfigError, HarnessError, PolarError
from polar.harness.agent.process import ProcessLimits, run_process
from polar.harness.agent.sandbox import Sandbox, SandboxOptions, check_runtime
from polar.harness.agent.session_relay import SessionRelay
from polar.types import CREDENTIAL_ENV

log = logging.getLogger(__name__)


@dataclass
class SessionContext:
    """What a runner needs to start one session's harness."""

    session_id: str
    task: dict[str, Any]
    workspace: Path
    gateway_url: str  # the node's root URL, e.g. http://127.0.0.1:8100 (a command harness: its relay's /s/<id>)
    api_key: str  # the session's secret key (polar.types.new_session_key): its credential at the gateway
    model: str = "polar"

    @property
    def openai_base_url(self) -> str:
        return f"{self.gateway_url.rstrip('/')}/v1"


@dataclass
class HarnessOutcome:
    """How the harness ended. ``error`` set means the session is ERROR (with that reason)."""

    output: str = ""
    returncode: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    error: str | None = None
    stderr_tail: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def task_prompt(task: dict[str, Any]) -> str:
    """The text a harness should act on: ``prompt``, else ``instruction``, else ``question``."""
    for key in ("prompt", "instruction", "question"):
        if isinstance(task.get(key), str):
            return task[key]
    raise HarnessError(f"task {task.get('id', '?')!r} has no 'prompt' (or 'instruction'/'question') string field")


def gateway_env(ctx: SessionContext) -> dict[str, str]:
    """Provider variables that point every official SDK at the gateway, with the session's own key."""
    root = ctx.gateway_url.rstrip("/")
    return {
        "OPENAI_BASE_URL": f"{root}/v1",
        "OPENAI_API_BASE": f"{root}/v1",  # litellm / langchain spelling
        "OPENAI_API_KEY": ctx.api_key,
        "ANTHROPIC_BASE_URL": root,
        "ANTHROPIC_API_KEY": ctx.api_key,
        "GOOGLE_GEMINI_BASE_URL": root,
        "GEMINI_API_KEY": ctx.api_key,
        "GOOGLE_API_KEY": ctx.api_key,
        "OPENAI_MODEL": ctx.model,
        "POLAR_SESSION_ID": ctx.session_id,
        "POLAR_WORKSPACE": str(ctx.workspace),
    }


class HarnessRunner:
    async def run(self, ctx: SessionContext, timeout_s: float, cancel: asyncio.Event) -> HarnessOutcome:
        raise NotImplementedError


class _SafeDict(dict):
    def __missing__(self, key: str) -> str:
        raise ConfigError(
            f"harness.command uses placeholder {{{key}}} but the task has no field {key!r}; "
            f"available: {', '.join(sorted(self))}"
        )


class CommandRunner(HarnessRunner):
    """Run a program per session in its own workspace, sandbox, process group and resource limits.

    ``sandbox`` is ``harness.sandbox`` (the presets' options: ``runtime``, ``network``, ``user``,
    ``ro_binds``). Inside bubblewrap the program sees a read-only system, read-only its own program (the
    install prefix of the command's executable, e.g. a venv and its base interpreter; ``{python}``'s prefix;
    the existing files and folders the command line names) and ``ro_binds`` (relative to the config
    folder), its workspace and a private HOME read-write, and nothing else of the host: not the run folder,
    not the task files, not other sessions. Its only network is its session's relay."""

    def __init__(
        self,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        task_input: str = "stdin",
        task_file: str = "task.json",
        limits: ProcessLimits | None = None,
        config_dir: Path | None = None,
        sandbox: SandboxOptions | dict[str, Any] | None = None,
    ) -> None:
        if not command:
            raise ConfigError("harness.command is empty; give the program and its arguments as a list")
        self.command = list(command)
        self.env = dict(env or {})
        self.task_input = task_input
        self.task_file = task_file
        self.limits = limits or ProcessLimits()
        self.config_dir = config_dir
        self.sandbox_options = (sandbox if isinstance(sandbox, SandboxOptions)
                                else SandboxOptions.from_dict(sandbox, "harness.sandbox"))
        # one runner per run: a sandbox that cannot work fails here; one that falls back says so, once
        check_runtime(self.sandbox_options, f"the harness command {self.command[0]!r}", "harness.sandbox")

    def _argv(self, ctx: SessionContext, task_path: Path) -> list[str]:
        values = _SafeDict({k: str(v) for k, v in ctx.task.items() if isinstance(v, (str, int, float))})
        values.update(
            prompt=task_prompt(ctx.task), task_file=str(task_path), workspace=str(ctx.workspace),
            base_url=ctx.openai_base_url, session_id=ctx.session_id, python=sys.executable,
            config_dir=str(self.config_dir or Path.cwd()),
        )
        return [part.format_map(values) for part in self.command]

    def _ro_paths(self, argv: list[str], env: dict[str, str], workspace: Path) -> list[str]:
        """What the program needs to see read-only: its executable's install prefix, ``{python}``'s prefix,
        the existing paths its command line names, and ``sandbox.ro_binds`` (relative to the config folder).
        A folder that holds the workspace is never bound (it would show the run folder and other sessions)."""
        found = shutil.which(argv[0], path=env.get("PATH")) if argv else None
        paths: list[Path] = []
        if found:
            paths += program_roots(Path(found))
            interpreter = _shebang(Path(found))  # a script's interpreter (e.g. a venv's python) must run too
            if interpreter is not None:
                paths += program_roots(interpreter)
        if sys.executable in argv:
            paths += program_roots(Path(sys.executable))
        for part in argv[1:]:
            if part.startswith("/") and os.path.exists(part):
                paths.append(Path(part))
        base = Path(self.config_dir or Path.cwd())
        paths += [(base / p).resolve() for p in (os.path.expanduser(p) for p in self.sandbox_options.ro_binds)]
        ws = workspace.resolve()
        out: list[str] = []
        for p in paths:
            p = Path(os.path.abspath(p))
            if p == ws or p in ws.parents or ws in p.parents or not p.exists():
                continue
            out.append(str(p))
        return list(dict.fromkeys(out))

    async def run(self, ctx: SessionContext, timeout_s: float, cancel: asyncio.Event) -> HarnessOutcome:
        # the program's only gateway address is a relay that passes this session's model calls and nothing else
        # (the gateway itself refuses /admin/* and other sessions without its token or their keys, too)
        task_path = ctx.workspace / self.task_file
        task_path.write_text(json.dumps(ctx.task))
        try:
            sandbox = await asyncio.to_thread(Sandbox.create, ctx.session_id, Path(ctx.workspace), None,
                                              self.sandbox_options, False)
        except (OSError, PolarError) as e:
            return HarnessOutcome(error=f"harness command: sandbox setup failed: {e}")
        relay = SessionRelay(ctx.gateway_url, ctx.session_id) if (
            not sandbox.isolated and ctx.gateway_url.startswith("http://")) else None
        try:
            if relay is not None:
                server = await relay.listen_tcp("127.0.0.1", 0)
                root = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            else:
                root = sandbox.gateway_url(ctx.gateway_url)
            if ctx.gateway_url.startswith("http://"):
                root = f"{root}/s/{quote(ctx.session_id, safe='')}"
            try:
                await asyncio.to_thread(sandbox.start, ctx.gateway_url)
            except (OSError, PolarError) as e:
                return HarnessOutcome(error=f"harness command: could not open the sandbox's route to the gateway: {e}")
            return await self._run(dataclasses.replace(ctx, gateway_url=root), sandbox, task_path, timeout_s, cancel)
        finally:
            if relay is not None:
                await relay.aclose()
            await asyncio.to_thread(sandbox.cleanup)

    async def _run(self, ctx: SessionContext, sandbox: Sandbox, task_path: Path, timeout_s: float,
                   cancel: asyncio.Event) -> HarnessOutcome:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_", "POLAR_")) and k not in CREDENTIAL_ENV}
        if sandbox.use_bwrap:  # the host's temp folders do not exist inside; its own HOME does
            env = {k: v for k, v in env.items() if k not in ("TMPDIR", "TMP", "TEMP")}
        env["HOME"] = str(sandbox.home)
        env.update(self.env)
        env.update(gateway_env(ctx))
        env["POLAR_TASK_FILE"] = str(task_path)
        stdin = task_prompt(ctx.task).encode() if self.task_input == "stdin" else None
        argv = self._argv(ctx, task_path)
        wrapped = sandbox.wrap(argv, ro_paths=self._ro_paths(argv, env, ctx.workspace))
        try:
            res = await run_process(
                wrapped, cwd=str(ctx.workspace), env=env, stdin=stdin, timeout_s=timeout_s,
                limits=self.limits, cancel=cancel,
            )
        except (FileNotFoundError, PermissionError) as e:
            return HarnessOutcome(error=f"harness command {argv[0]!r} could not start: {e}")
        out = HarnessOutcome(
            output=res.stdout.decode("utf-8", "replace"),
            returncode=res.returncode,
            timed_out=res.timed_out,
            cancelled=res.cancelled,
            stderr_tail=res.stderr_tail(),
            details={"duration_s": round(res.duration_s, 3), "leftover_pids": res.leftover_pids,
                     "sandbox": sandbox.report},
        )
        if res.output_exceeded:
            out.error = f"harness wrote more than {self.limits.output_bytes} bytes of output; it was killed"
        elif res.timed_out or res.cancelled:
            pass  # the pipeline marks TIMEOUT / CANCELLED
        elif res.returncode != 0:
            sig = f" (killed by signal {-res.returncode})" if res.returncode and res.returncode < 0 else ""
            out.error = f"harness exited with code {res.returncode}{sig}: {out.stderr_tail[-300:] or 'no stderr'}"
        elif res.leftover_pids:
            out.error = (
                f"harness exited but left {len(res.leftover_pids)} process(es) running "
                f"(pids {res.leftover_pids[:5]}); they were killed. Wait for children before exiting."
            )
        return out


SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/lib32/", "/etc/")


def program_roots(executable: Path) -> list[Path]:
    """The folders a program needs read-only in a sandbox that shows only the system: for a file in a
    virtual environment the environment and its base interpreter's prefix (``pyvenv.cfg``'s ``home``), for a
    package under ``node_modules`` that folder, else the executable's own folder; for the target of a
    symlink the same again. Nothing for the system's own folders, which every sandbox sees."""
    out: list[Path] = []
    for path in dict.fromkeys([Path(os.path.abspath(executable)), executable.resolve()]):
        if str(path).startswith(SYSTEM_PREFIXES):
            continue
        root = path.parent
        for parent in path.parents:
            if (parent / "pyvenv.cfg").is_file():
                root = parent
                home = _venv_home(parent / "pyvenv.cfg")
                if home is not None and not str(home).startswith(SYSTEM_PREFIXES):
                    out.append(home.parent if home.name == "bin" else home)
                break
            if parent.name == "node_modules":
                root = parent
                break
        out.append(root)
    return out


def _shebang(path: Path) -> Path | None:
    """The absolute interpreter named by a script's ``#!`` line (``/usr/bin/env`` names none), else None."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode("utf-8", "replace").split()
    if not parts or not parts[0].startswith("/") or parts[0].endswith("/env"):
        return None
    return Path(parts[0])


def _venv_home(cfg: Path) -> Path | None:
    for line in cfg.read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve()
    return None


def import_callable(spec: str, config_dir: Path | None = None) -> Any:
    """Import ``module:function``; the module may sit next to the config file."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"expected 'module:function', got {spec!r}")
    added = None
    if config_dir is not None and str(config_dir) not in sys.path:
        sys.path.insert(0, str(config_dir))
        added = str(config_dir)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ConfigError(f"cannot import module {module_name!r} for {spec!r}: {e}. Put it next to the config or on PYTHONPATH.") from None
    finally:
        if added is not None and added in sys.path:
            sys.path.remove(added)
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        names = [n for n in dir(module) if not n.startswith("_")]
        from polar.config.base import did_you_mean

        raise ConfigError(f"{module_name!r} has no callable {attr!r}{did_you_mean(attr, names)}")
    return fn


async def wait_or_cancel(job: asyncio.Future[Any], timeout_s: float, cancel: asyncio.Event
                         ) -> Literal["done", "timeout", "cancelled"]:
    """Wait for ``job`` until it ends, ``timeout_s`` passes or ``cancel`` is set, and say which. A timeout or
    a cancel cancels ``job`` (the caller decides whether to await it); so does the caller's own cancellation
    (the session's budget running out above it), which then propagates. The waiter on ``cancel`` never
    outlives the call."""
    stop = asyncio.ensure_future(cancel.wait())
    try:
        done, _ = await asyncio.wait([job, stop], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        job.cancel()
        raise
    finally:
        stop.cancel()
    if job in done:
        return "done"
    job.cancel()
    return "cancelled" if done else "timeout"


class CallableRunner(HarnessRunner):
    """A Python function as a harness. Sync functions run in a thread; on timeout they are abandoned."""

    def __init__(self, spec: str, config_dir: Path | None = None) -> None:
        self.spec = spec
        self.fn = import_callable(spec, config_dir)
        params = inspect.signature(self.fn).parameters
        self._wants_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._params = set(params)
        if not self._wants_all and not {"base_url", "task"} <= self._params:
            raise ConfigError(f"harness callable {spec!r} must accept 'base_url' and 'task' keyword arguments")

    def _kwargs(self, ctx: SessionContext) -> dict[str, Any]:
        every = {
            "base_url": ctx.openai_base_url, "task": ctx.task, "api_key": ctx.api_key, "workspace": ctx.workspace,
            "session_id": ctx.session_id, "model": ctx.model, "gateway_url": ctx.gateway_url,
        }
        return every if self._wants_all else {k: v for k, v in every.items() if k in self._params}

    async def run(self, ctx: SessionContext, timeout_s: float, cancel: asyncio.Event) -> HarnessOutcome:
        kwargs = self._kwargs(ctx)
        if inspect.iscoroutinefunction(self.fn):
            job = asyncio.ensure_future(self.fn(**kwargs))
        else:
            job = asyncio.ensure_future(asyncio.to_thread(self.fn, **kwargs))
        ended = await wait_or_cancel(job, timeout_s, cancel)
        if ended != "done":  # a sync function's thread cannot be stopped: it is abandoned, not awaited
            return HarnessOutcome(timed_out=ended == "timeout", cancelled=ended == "cancelled")
        try:
            result = job.result()
        except Exception as e:  # the harness's own failure is data, not a crash
            return HarnessOutcome(error=f"harness callable {self.spec} raised {type(e).__name__}: {e}")
        output = result if isinstance(result, str) else json.dumps(result) if result is not None else ""
        return HarnessOutcome(output=output, returncode=0)
