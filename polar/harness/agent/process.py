"""Run one harness program under limits and make sure nothing it started survives.

Three nets catch what a harness leaves behind:

1. it starts in its own session/process group (``start_new_session``), so one ``killpg`` reaches
   every child that stayed in the group;
2. while it runs, its descendants are snapshotted with psutil, so children that moved to their
   own group (``setsid``) are remembered even after the parent exits;
3. every process it starts inherits ``POLAR_SESSION_TAG=<unique>`` in its environment; at the end
   all processes of this user are scanned for the tag, which finds double-forked daemons that were
   re-parented to init before a snapshot saw them.

A harness that scrubs its own environment *and* double-forks between two snapshots can escape;
that is the price of staying cgroup-free (cgroups need privileges we do not assume).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from polar.lifetime import parent_death_hook

log = logging.getLogger(__name__)

TAG_VAR = "POLAR_SESSION_TAG"
_SNAPSHOT_INTERVAL_S = 0.2


@dataclass
class ProcessLimits:
    """``setrlimit`` values for the child; 0 disables a limit."""

    cpu_time_s: int = 600
    memory_mb: int = 4096
    open_files: int = 1024
    file_size_mb: int = 1024
    output_bytes: int = 1_000_000


@dataclass
class ProcessResult:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    cancelled: bool = False
    output_exceeded: bool = False
    leftover_pids: list[int] = field(default_factory=list)  # processes still alive after the harness exited
    duration_s: float = 0.0

    def stderr_tail(self, n: int = 500) -> str:
        return self.stderr[-n:].decode("utf-8", "replace").strip()


def _preexec(limits: ProcessLimits) -> Callable[[], None]:
    """Build the child-side hook. Only async-signal-safe-ish syscalls: no imports, no allocation-heavy work."""
    pairs: list[tuple[int, tuple[int, int]]] = []
    if limits.cpu_time_s:
        pairs.append((resource.RLIMIT_CPU, (limits.cpu_time_s, limits.cpu_time_s + 1)))
    if limits.memory_mb:
        pairs.append((resource.RLIMIT_AS, (limits.memory_mb << 20, limits.memory_mb << 20)))
    if limits.open_files:
        pairs.append((resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files)))
    if limits.file_size_mb:
        pairs.append((resource.RLIMIT_FSIZE, (limits.file_size_mb << 20, limits.file_size_mb << 20)))
    setrlimit = resource.setrlimit

    def hook() -> None:
        for kind, value in pairs:
            setrlimit(kind, value)

    return hook


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Processes of this user whose environment carries ``POLAR_SESSION_TAG=tag``."""
    found = []
    me = os.getpid()
    needle = f"{TAG_VAR}={tag}".encode()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(proc)
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_all(root_pid: int, known: dict[int, psutil.Process], tag: str) -> list[int]:
    """SIGKILL the process group, known descendants and tagged processes; return pids that were alive."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root_pid, signal.SIGKILL)
    targets = dict(known)
    for proc in tagged_processes(tag):
        targets.setdefault(proc.pid, proc)
    killed = []
    for pid, proc in targets.items():
        if pid == root_pid or not _alive(proc):
            continue
        killed.append(pid)
        with contextlib.suppress(psutil.Error):
            proc.kill()
    if killed:
        psutil.wait_procs([targets[p] for p in killed], timeout=5)
    return killed


class _Capped:
    """Keep the first ``cap`` bytes of a stream; count the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.buf)
        if room > 0:
            self.buf += chunk[:room]


async def run_process(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    stdin: bytes | None,
    timeout_s: float,
    limits: ProcessLimits,
    cancel: asyncio.Event | None = None,
) -> ProcessResult:
    """Run ``argv`` to completion (or timeout / cancel / output cap); kill everything it started."""
    tag = uuid.uuid4().hex
    env = {**env, TAG_VAR: tag}
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        # SIGKILL with polar (prctl parent-death signal), from the event loop's thread, which outlives the call
        preexec_fn=parent_death_hook(_preexec(limits)),
    )
    known: dict[int, psutil.Process] = {}
    out, err = _Capped(limits.output_bytes), _Capped(limits.output_bytes)
    exceeded = asyncio.Event()

    async def pump(stream: asyncio.StreamReader, sink: _Capped) -> None:
        while chunk := await stream.read(65536):
            sink.feed(chunk)
            if out.total + err.total > limits.output_bytes:
                exceeded.set()
                return

    async def feed_stdin() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin or b"")
            await proc.stdin.drain()
            proc.stdin.close()

    async def snapshot() -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(proc.pid)
            while True:
                with contextlib.suppress(psutil.Error):
                    for child in root.children(recursive=True):
                        known.setdefault(child.pid, child)
                await asyncio.sleep(_SNAPSHOT_INTERVAL_S)

    assert proc.stdout is not None and proc.stderr is not None  # both are pipes
    tasks = [asyncio.ensure_future(pump(proc.stdout, out)), asyncio.ensure_future(pump(proc.stderr, err))]
    helpers = [asyncio.ensure_future(snapshot())]
    if stdin is not None:
        helpers.append(asyncio.ensure_future(feed_stdin()))
    async def exited() -> None:
        # Process.wait() also waits for the pipes to close, which a leftover child can hold open forever.
        while proc.returncode is None:
            await asyncio.sleep(0.05)

    waiter = asyncio.ensure_future(exited())
    stoppers = [asyncio.ensure_future(exceeded.wait())]
    if cancel is not None:
        stoppers.append(asyncio.ensure_future(cancel.wait()))
    timed_out = cancelled = False
    try:
        done, _ = await asyncio.wait([waiter, *stoppers], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            timed_out = True
        elif waiter not in done:
            cancelled = cancel is not None and cancel.is_set() and not exceeded.is_set()
    finally:
        # The harness itself is done (or being stopped). Whatever else is alive now is a leftover.
        leftovers = []
        if waiter.done():
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children(recursive=True) if _pid_alive(proc.pid) else []:
                    known.setdefault(child.pid, child)
            leftovers = [p for p, pr in known.items() if _alive(pr)] + [
                p.pid for p in tagged_processes(tag) if p.pid not in known and _alive(p)
            ]
        kill_all(proc.pid, known, tag)
        for t in (*stoppers, *helpers):
            t.cancel()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        waiter.cancel()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=10)
        # drain what is left in the pipes (the writers are dead, so this ends)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
        for t in tasks:
            t.cancel()
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()  # release the pipes now, not at garbage collection on a closed loop
    return ProcessResult(
        returncode=proc.returncode,
        stdout=bytes(out.buf),
        stderr=bytes(err.buf),
        timed_out=timed_out,
        cancelled=cancelled,
        output_exceeded=exceeded.is_set(),
        leftover_pids=sorted(set(leftovers)),
        duration_s=time.monotonic() - start,
    )


def _pid_alive(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return _alive(psutil.Process(pid))
    return False
