"""Running a workspace's code for a verifier, in the agent's isolation, on a copy the task controls.

A workspace an agent leaves behind is hostile input: its code may write anywhere it can, reach any
socket, plant links for the grader to follow, or hook the test runner to report passes it did not
earn. A :class:`VerifySandbox` runs it so that none of that reaches the host or the reward:

- **isolation**: bubblewrap (:func:`polar.harness.agent.sandbox.bwrap_args`) with a read-only system
  and interpreter, a fresh ``/tmp``, no network at all (``--unshare-net``, no relay), the unprivileged
  user ``nobody`` when polar runs as root, and limits: wall clock, CPU time, address space, file size,
  open files and processes (``prlimit --nproc``);
- **a copy**: the workspace is copied into a fresh folder without following links (links that point
  out of it are dropped), special files are skipped, and size and file count are capped;
- **files the task owns**: ``conftest.py`` anywhere, ``pytest.ini``, ``tox.ini``, ``setup.cfg``,
  ``pyproject.toml``, ``sitecustomize.py``, ``usercustomize.py``, ``*.pth``, ``__pycache__`` and ``*.pyc``
  are removed from the copy and restored from the task's repository where it has them; test files the
  task names are restored too; every write opens with ``O_NOFOLLOW`` on a path whose folders are not links;
- **the verdict**: :mod:`polar.harness.agent.verify_runner` (read-only in the sandbox) reads a one-time
  nonce from stdin before any workspace code runs and writes ``<nonce> <code> <how>`` to a verdict file
  outside the copy only when the tests ran to their end; pytest's junit report is written there too and
  read back without following links. Output the code prints never decides the reward.

Where bubblewrap cannot work, :func:`require_isolation` refuses unless the verifier's config says
``trusted_workspace: true``, which runs the code on the host as this user (for workspaces you wrote).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from polar.errors import HarnessError
from polar.harness.agent.process import ProcessLimits, ProcessResult, run_process
from polar.harness.agent.sandbox import NOBODY, _chown_tree, bwrap_args, bwrap_unusable, setpriv_args

log = logging.getLogger(__name__)

RUNNER = Path(__file__).resolve().parent / "verify_runner.py"
#: Files that decide how tests run (hooks, options, interpreter start-up): the task's, never the agent's.
TASK_OWNED_NAMES = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
                              "sitecustomize.py", "usercustomize.py"})
TASK_OWNED_SUFFIXES = (".pth", ".pyc", ".pyo")
#: Folders never copied: version control, CLI state, caches and bytecode that could shadow test modules.
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", ".claude", ".codex", ".qwen", ".gemini", ".pi", ".opencode",
                          "node_modules", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
TRUSTED_KEY = "trusted_workspace"


class WorkspaceRefused(HarnessError):
    """The workspace cannot be graded as it is (too large, too many files): reward 0 with this reason."""


def _trusted_meaning(verifier: str, why: str) -> str:
    return (f"verifier {verifier}: {TRUSTED_KEY}: true and {why}, so the workspace's code runs on this host, "
            f"as uid {os.geteuid()}, with this machine's network and files, and can change its own reward. "
            "Use it only for workspaces you wrote yourself, never for a model's output in RL")


_WARNED: set[str] = set()


def require_isolation(verifier: str, trusted_workspace: bool) -> bool:
    """True when the workspace's code will run in bubblewrap; False when it will run unisolated because
    the config trusts the workspace (said once per verifier in the log); a HarnessError otherwise."""
    why = bwrap_unusable()
    if why is None:
        return True
    if not trusted_workspace:
        raise HarnessError(
            f"verifier {verifier} runs code the model wrote (untrusted) and runs it only inside bubblewrap, but "
            f"{why}; make bubblewrap work, or set verifier.{TRUSTED_KEY}: true to run it on this host unisolated "
            "(only for code you trust)")
    if verifier not in _WARNED:
        _WARNED.add(verifier)
        log.warning(_trusted_meaning(verifier, why))
    return False


# ---- reading and writing without following links ------------------------------------------------------


def read_untrusted(path: Path, max_bytes: int) -> bytes | None:
    """The content of a regular file that sandboxed code could have replaced: not through a link, not a
    FIFO or device, at most ``max_bytes`` (None when any of that fails)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        chunks, left = [], max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data if len(data) <= max_bytes else None
    finally:
        os.close(fd)


def _open_dir_nofollow(root: Path, parts: Iterable[str], *, create: bool, owner: int | None) -> int:
    """An fd of ``root/parts...``, walking one component at a time with ``O_NOFOLLOW``; a component that is
    a link or not a folder is replaced by a fresh folder when ``create``, else an OSError."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise HarnessError(f"path component {part!r} is not allowed in {root}")
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                if not create:
                    raise
                _remove_at(fd, part)
                os.mkdir(part, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(part, owner, owner, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _remove_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` in ``dir_fd`` whatever it is (a link is removed, never followed)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            for entry in os.listdir(sub):
                _remove_at(sub, entry)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _write_all(fd: int, data: bytes, owner: int | None) -> None:
    """All of ``data`` into ``fd`` (``os.write`` may take less than it is given), then the file to ``owner``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if owner is not None:
        os.fchown(fd, owner, owner)


def write_nofollow(root: Path, rel: str, data: bytes, *, owner: int | None = None, mode: int = 0o644) -> Path:
    """Write ``root/rel`` as a new regular file: no folder on the way and not the file itself is followed
    if it is a link (whatever is there is replaced), so a planted link never redirects the write."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise HarnessError(f"file {rel!r} must be a relative path inside {root}")
    dir_fd = _open_dir_nofollow(root, parts[:-1], create=True, owner=owner)
    try:
        _remove_at(dir_fd, parts[-1])
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=dir_fd)
        try:
            _write_all(fd, data, owner)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    return root / rel


# ---- the copy -----------------------------------------------------------------------------------------


@dataclass
class CopyReport:
    files: int = 0
    bytes: int = 0
    dropped_links: list[str] = field(default_factory=list)  # links that point out of the copy
    skipped: list[str] = field(default_factory=list)  # FIFOs, sockets, devices
    removed: list[str] = field(default_factory=list)  # files the task owns, taken out of the copy
    keep_task_owned: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "bytes": self.bytes, "dropped_links": self.dropped_links[:50],
                "skipped": self.skipped[:50], "removed": self.removed[:50]}


def _link_stays_inside(rel_link: str, target: str) -> bool:
    if os.path.isabs(target):
        return False
    joined = os.path.normpath(os.path.join(os.path.dirname(rel_link), target))
    return joined != ".." and not joined.startswith("../") and not os.path.isabs(joined)


def _task_owned(name: str) -> bool:
    return name in TASK_OWNED_NAMES or name.endswith(TASK_OWNED_SUFFIXES)


def copy_workspace(src: Path, dst: Path, *, owner: int | None = None, max_bytes: int = 256 << 20,
                   max_files: int = 20_000, report: CopyReport | None = None, keep_task_owned: bool = False) -> CopyReport:
    """Copy ``src`` into the empty folder ``dst`` without following any link: files the task owns (unless
    ``keep_task_owned``: a copy to diff, not to run), caches and CLI state are left out; links are kept only
    when they point inside the copy; FIFOs, sockets and devices are skipped. Over ``max_bytes`` or
    ``max_files`` it raises WorkspaceRefused."""
    report = report or CopyReport()
    report.keep_task_owned = keep_task_owned
    src_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    dst_fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _copy_dir(src_fd, dst_fd, "", owner, max_bytes, max_files, report)
    finally:
        os.close(src_fd)
        os.close(dst_fd)
    return report


def _copy_dir(src_fd: int, dst_fd: int, rel: str, owner: int | None, max_bytes: int, max_files: int,
              report: CopyReport) -> None:
    for name in sorted(os.listdir(src_fd)):
        path = f"{rel}{name}"
        st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        report.files += 1
        if report.files > max_files:
            raise WorkspaceRefused(f"the workspace holds more than {max_files} files; the verifier copies at most that many")
        if stat.S_ISDIR(st.st_mode):
            if name in SKIPPED_DIRS:
                continue
            os.mkdir(name, 0o755, dir_fd=dst_fd)
            if owner is not None:
                os.chown(name, owner, owner, dir_fd=dst_fd, follow_symlinks=False)
            s = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src_fd)
            d = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dst_fd)
            try:
                _copy_dir(s, d, path + "/", owner, max_bytes, max_files, report)
            finally:
                os.close(s)
                os.close(d)
        elif name.endswith((".pyc", ".pyo")) or (_task_owned(name) and not report.keep_task_owned):
            report.removed.append(path)
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=src_fd)
            if _link_stays_inside(path, target):
                os.symlink(target, name, dir_fd=dst_fd)
                if owner is not None:
                    os.chown(name, owner, owner, dir_fd=dst_fd, follow_symlinks=False)
            else:
                report.dropped_links.append(f"{path} -> {target}")
        elif stat.S_ISREG(st.st_mode):
            report.bytes += st.st_size
            if report.bytes > max_bytes:
                raise WorkspaceRefused(f"the workspace holds more than {max_bytes >> 20} MiB; the verifier copies "
                                       "at most that much")
            _copy_file(src_fd, dst_fd, name, st.st_mode, owner)
        else:
            report.skipped.append(path)


def _copy_file(src_fd: int, dst_fd: int, name: str, mode: int, owner: int | None) -> None:
    s = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_fd)
    try:
        if not stat.S_ISREG(os.fstat(s).st_mode):
            return
        d = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode & 0o755,
                    dir_fd=dst_fd)
        try:
            while chunk := os.read(s, 1 << 20):
                _write_all(d, chunk, None)
            if owner is not None:
                os.fchown(d, owner, owner)
        finally:
            os.close(d)
    finally:
        os.close(s)


def sanitize(copy: Path, report: CopyReport) -> None:
    """Remove from ``copy`` (after a patch was applied to it) what the task owns and links that leave it."""
    for dirpath, dirnames, filenames in os.walk(copy):
        rel_dir = os.path.relpath(dirpath, copy)
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if os.path.islink(full):
                if not _link_stays_inside(rel, os.readlink(full)):
                    os.unlink(full)
                    report.dropped_links.append(rel)
                elif _task_owned(name):
                    os.unlink(full)
                    report.removed.append(rel)
            elif name in dirnames and name in SKIPPED_DIRS:
                shutil.rmtree(full)
                report.removed.append(rel)
            elif name in filenames and _task_owned(name):
                os.unlink(full)
                report.removed.append(rel)
        dirnames[:] = [d for d in dirnames if os.path.isdir(os.path.join(dirpath, d))
                       and not os.path.islink(os.path.join(dirpath, d))]


def restore_from_task(copy: Path, task_root: Path, rels: Iterable[str] = (), *, owner: int | None = None) -> list[str]:
    """Write the task's own versions of its test files (``rels``) and of every file it owns
    (``conftest.py``, ``pytest.ini``, ...) into ``copy``, never through a link; the paths restored."""
    wanted = dict.fromkeys(rels)
    for dirpath, dirnames, filenames in os.walk(task_root):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
        for name in filenames:
            if name in TASK_OWNED_NAMES:
                wanted.setdefault(os.path.relpath(os.path.join(dirpath, name), task_root))
    restored = []
    for rel in wanted:
        data = read_untrusted(task_root / rel, 64 << 20)
        if data is None:
            raise HarnessError(f"task file {rel!r} is not a regular file in {task_root}")
        write_nofollow(copy, rel, data, owner=owner)
        restored.append(rel)
    return restored


def chown_tree(path: Path, uid: int) -> None:
    """Give ``path`` and everything under it to ``uid`` (links themselves, never their targets)."""
    _chown_tree(path, uid, uid)


def _remove_tree(path: Path) -> None:
    """Delete a verify folder, whatever modes the sandboxed code left on it (links are never followed)."""
    def retry(func: Any, p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
        with contextlib.suppress(OSError):
            func(p)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)


# ---- the sandbox ---------------------------------------------------------------------------------------


def interpreter_paths() -> list[str]:
    """What the sandbox must see read-only to run this interpreter: its virtualenv and its base install."""
    found = []
    for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix):
        for q in (p, os.path.realpath(p)):
            if not q.startswith(("/usr/", "/etc/")) and q not in ("/usr", "/"):
                found.append(q)
    return list(dict.fromkeys(found))


def signal_of(returncode: int | None, wrapped: bool) -> int | None:
    """The signal that ended a program: a negative return code, or through bubblewrap (whose init reports
    its child's death by signal N as exit code 128 + N) a code above 128."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if wrapped and 128 < returncode < 128 + signal.NSIG:
        return returncode - 128
    return None


@dataclass
class IsolatedRun:
    """One run of the verify runner: the process, and the verdict the runner wrote (None when it wrote
    none: killed, timed out, or the code ended the process before the tests finished)."""

    process: ProcessResult
    exit_code: int | None
    how: str | None
    isolation: dict[str, str]
    signal: int | None

    @property
    def completed(self) -> bool:
        return self.exit_code is not None and not self.process.timed_out

    def why_not(self) -> str | None:
        """Why the run did not end with a verdict, or None when it did."""
        if self.process.timed_out:
            return "timed out"
        if self.exit_code is None:
            sig = f" (killed by signal {self.signal})" if self.signal else ""
            return f"the test process ended without the runner's verdict{sig}: the code ended it early or a limit killed it"
        return None

    def details(self) -> dict[str, Any]:
        return {"returncode": self.process.returncode, "exit_code": self.exit_code, "how": self.how,
                "signal": self.signal, "timed_out": self.process.timed_out,
                "stdout": self.process.stdout[-2000:].decode("utf-8", "replace"),
                "stderr": self.process.stderr_tail(2000), "isolation": self.isolation,
                "duration_s": round(self.process.duration_s, 3)}


class VerifySandbox:
    """A throwaway folder (``work/`` the copy, ``polar/`` read-only files polar wrote, ``out/`` the verdict)
    and the isolated command that runs the verify runner on it. Use as a context manager."""

    def __init__(self, verifier: str, *, trusted_workspace: bool = False, timeout_s: float = 60.0,
                 cpu_time_s: int = 60, memory_mb: int = 2048, file_size_mb: int = 64, max_processes: int = 64,
                 open_files: int = 256, python: str | None = None, extra_ro: Iterable[str] = ()) -> None:
        self.verifier = verifier
        self.isolated = require_isolation(verifier, trusted_workspace)
        self.uid = NOBODY if self.isolated and os.geteuid() == 0 else None
        self.timeout_s, self.max_processes = timeout_s, max_processes
        self.limits = ProcessLimits(cpu_time_s=cpu_time_s, memory_mb=memory_mb, open_files=open_files,
                                    file_size_mb=file_size_mb, output_bytes=200_000)
        self.python = python or sys.executable
        self.extra_ro = [*interpreter_paths(), *extra_ro] if python is None else list(extra_ro)
        self.root = Path(tempfile.mkdtemp(prefix="polar-verify-"))
        os.chmod(self.root, 0o711)
        self.work, self.polar, self.out = self.root / "work", self.root / "polar", self.root / "out"
        for d in (self.work, self.polar, self.out):
            d.mkdir(mode=0o755)
        if self.uid is not None:
            os.chown(self.work, self.uid, self.uid)
            os.chown(self.out, self.uid, self.uid)
        self.report = CopyReport()

    def __enter__(self) -> VerifySandbox:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        _remove_tree(self.root)

    @property
    def isolation(self) -> dict[str, str]:
        return {"runtime": "bwrap" if self.isolated else "none (trusted_workspace)",
                "network": "none" if self.isolated else "host",
                "user": "nobody" if self.uid is not None else f"uid {os.geteuid()}"}

    def copy_in(self, workspace: Path, max_bytes: int = 256 << 20, max_files: int = 20_000,
                keep_task_owned: bool = False) -> CopyReport:
        """Copy a folder into ``work/``: the workspace (files the task owns left out), or with
        ``keep_task_owned`` the task's own clean repository (a patch applies to it whole; :func:`sanitize`
        and :func:`restore_from_task` run after)."""
        if not workspace.is_dir():
            raise HarnessError(f"verifier {self.verifier}: workspace {workspace} is not a folder")
        return copy_workspace(workspace, self.work, owner=self.uid, report=self.report, max_bytes=max_bytes,
                              max_files=max_files, keep_task_owned=keep_task_owned)

    def write_polar_file(self, name: str, text: str) -> Path:
        """A file polar owns (tests, the pytest config): read-only to the code."""
        return write_nofollow(self.polar, name, text.encode(), mode=0o644)

    def command(self, inner: list[str]) -> list[str]:
        argv = list(inner)
        if self.max_processes and shutil.which("prlimit"):
            argv = ["prlimit", f"--nproc={self.max_processes}:{self.max_processes}", "--", *argv]
        if self.uid is not None:
            argv = [*setpriv_args(self.uid), *argv]
        if not self.isolated:
            return argv
        ro = [str(self.polar), str(RUNNER), *self.extra_ro]
        return bwrap_args(rw=[str(self.work), str(self.out)], ro=ro, unshare_net=True, chdir=str(self.work)) + argv

    async def run(self, mode: str, args: list[str]) -> IsolatedRun:
        """Run the verify runner (``script`` or ``pytest``) on the copy; its verdict read back safely."""
        nonce = secrets.token_hex(16)
        verdict = self.out / "verdict"
        inner = [self.python, "-I", "-B", str(RUNNER), mode, str(verdict), str(self.work), *args]
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp" if self.isolated else str(self.root),
               "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "LANG": "C.UTF-8"}
        t0 = time.monotonic()
        res = await run_process(self.command(inner), cwd=str(self.work), env=env, stdin=f"{nonce}\n".encode(),
                                timeout_s=self.timeout_s, limits=self.limits)
        log.debug("verifier %s: sandboxed run took %.3fs", self.verifier, time.monotonic() - t0)
        code: int | None = None
        how: str | None = None
        raw = read_untrusted(verdict, 4096)
        # the first line: a program that forked may leave one per copy of the runner
        fields = raw.decode("ascii", "replace").split("\n", 1)[0].split() if raw else []
        if len(fields) == 3 and secrets.compare_digest(fields[0], nonce) and fields[1].lstrip("-").isdigit():
            code, how = int(fields[1]), fields[2]
        return IsolatedRun(res, code, how, self.isolation, signal_of(res.returncode, wrapped=self.isolated))


#: The pytest configuration polar gives with ``-c``: the workspace's own ini files, ``addopts`` and plugin
#: entry points never apply.
PYTEST_INI = "[pytest]\naddopts =\njunit_family = xunit1\n"


@dataclass
class PytestRun:
    """Per-test outcomes (``PASSED``/``FAILED``/``SKIPPED``; ``MISSING`` when the report lacks a test) and
    whether the run counts: the runner's verdict arrived, pytest exited 0, and the report agrees."""

    outcomes: dict[str, str]
    all_passed: bool
    run: IsolatedRun
    why: str | None = None

    def details(self) -> dict[str, Any]:
        return {**self.run.details(), "tests": self.outcomes, "all_passed": self.all_passed,
                **({"why": self.why} if self.why else {})}


async def run_pytest(box: VerifySandbox, tests: list[str], extra_args: Iterable[str] = ()) -> PytestRun:
    """Run pytest on ``box.work`` for the node ids ``tests`` with polar's config (``-c``), the copy as
    rootdir and confcutdir, no cache, plugin autoload off, append import mode (a workspace module cannot
    shadow pytest or the standard library), and the junit report written to ``out/``."""
    import xml.etree.ElementTree as ET

    ini = box.write_polar_file("pytest.ini", PYTEST_INI)
    report = box.out / "report.xml"
    args = ["-c", str(ini), f"--rootdir={box.work}", f"--confcutdir={box.work}", "-p", "no:cacheprovider",
            "--import-mode=append", "-q", f"--junitxml={report}", *extra_args, *tests]
    run = await box.run("pytest", args)
    outcomes = {t: "MISSING" for t in tests}
    raw = read_untrusted(report, 16 << 20)
    if raw is not None:
        try:
            root = ET.fromstring(raw)
        except ET.ParseError:
            root = None
        for case in root.iter("testcase") if root is not None else ():
            file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
            test_id = f"{file}::{case.get('name')}"
            status = "PASSED"
            for child in case:
                if child.tag in ("failure", "error"):
                    status = "FAILED"
                elif child.tag == "skipped" and status == "PASSED":
                    status = "SKIPPED"
            if test_id in outcomes:
                outcomes[test_id] = status if outcomes[test_id] in ("MISSING", "PASSED") else outcomes[test_id]
    why = run.why_not()
    if why is None and run.exit_code != 0:
        why = f"pytest exited {run.exit_code}"
    elif why is None and run.how != "completed":
        why = f"the runner ended as {run.how!r}"
    elif why is None and any(s != "PASSED" for s in outcomes.values()):
        why = "pytest exited 0 but its report does not show every test passed"
    return PytestRun(outcomes, why is None, run, why)
