"""A sandbox per agent session: a fresh workspace copy, a private HOME, and (where the machine allows)
a bubblewrap container whose only network route leads to the gateway.

Layers, each used when available and reported in :attr:`Sandbox.report`:

- **workspace**: the task's repository copied into the session workspace and committed as a git
  baseline (tag ``polar-base``), so the session's change is exactly ``git diff polar-base``;
- **private HOME**: a sibling folder (never inside the workspace, so CLI config never enters the diff);
- **unprivileged user**: when polar runs as root, the CLI runs as ``nobody`` (``setpriv``), owning
  only the session's folders;
- **bubblewrap** (``runtime: bwrap``; Debian package ``bubblewrap``): new user/pid/ipc/uts/net
  namespaces, a read-only view of ``/usr``, ``/etc`` and the CLI install, a fresh ``/tmp``, and the
  session folders read-write. With ``network: gateway`` the net namespace has only loopback; the
  gateway is reached through :mod:`polar.harness.agent.relay` (loopback port inside -> Unix socket bind-mounted
  in -> :class:`HostRelay`, which passes only the session's own model calls -> the gateway's TCP
  address). Nothing else is routable.

Resource limits (CPU time, address space, open files, file size) and kill-everything-at-the-end
are applied by :func:`polar.harness.agent.process.run_process`, which runs the wrapped command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from polar.errors import ConfigError, HarnessError
from polar.harness.agent.session_relay import SessionRelay

log = logging.getLogger(__name__)

INNER_PORT = 18080  # the gateway's port as seen inside an isolated sandbox (own net namespace: no clashes)
RELAY_SCRIPT = Path(__file__).resolve().parent / "relay.py"
BASE_TAG = "polar-base"
NOBODY = 65534
#: The sandbox's own ``/tmp`` and ``/dev/shm``: memory-backed, so capped (a tmpfs is not counted in the
#: process's address-space limit), and writable by the sandbox user, as a user's /tmp is.
TMP_SIZE_MB = 256
SHM_SIZE_MB = 64
#: Folders a SWE-style diff leaves out: CLI state and caches, never part of a solution.
DIFF_EXCLUDES = (
    ".claude", ".codex", ".qwen", ".gemini", ".pi", ".opencode", "node_modules", ".venv",
    "__pycache__", ".pytest_cache", "*.pyc",
)


@dataclass
class SandboxOptions:
    """``preset_options.sandbox``. ``auto`` picks the strongest layer this machine supports."""

    runtime: Literal["auto", "bwrap", "none"] = "auto"
    network: Literal["gateway", "host", "none"] = "gateway"  # none: no network at all (code execution)
    user: Literal["auto", "nobody", "current"] = "auto"
    ro_binds: list[str] = field(default_factory=list)
    keep: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, where: str = "harness.preset_options.sandbox") -> SandboxOptions:
        """Checked options; ``where`` is the config key named in errors (presets' or a command harness's)."""
        if d is not None and not isinstance(d, dict):
            raise ConfigError(f"{where} must be a mapping like {{runtime: auto, network: gateway}}, got {d!r}")
        d = dict(d or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            from polar.config.base import did_you_mean

            raise ConfigError(
                f"{where}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], known)}; "
                f"valid keys: {', '.join(sorted(known))}"
            )
        opts = cls(**d)
        for name, allowed in (("runtime", ("auto", "bwrap", "none")), ("network", ("gateway", "host", "none")),
                              ("user", ("auto", "nobody", "current"))):
            if getattr(opts, name) not in allowed:
                raise ConfigError(f"{where}.{name}: {getattr(opts, name)!r} is not one of {', '.join(allowed)}")
        if not isinstance(opts.ro_binds, list) or not all(isinstance(p, str) for p in opts.ro_binds):
            raise ConfigError(f"{where}.ro_binds must be a list of paths, got {opts.ro_binds!r}")
        return opts


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def bwrap_unusable() -> str | None:
    """Why bubblewrap cannot isolate sessions on this machine, or None when it can (tried once per binary)."""
    found = bwrap_path()
    if found is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install -y bubblewrap)"
    if not _bwrap_works(found):
        return (f"bubblewrap ({found}) cannot create namespaces here ({_BWRAP_ERR.get(found) or 'no reason given'}); "
                "unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone, "
                "or the container's seccomp/AppArmor policy)")
    return None


def _bwrap_required(why: str) -> str:
    return f"sandbox.runtime is 'bwrap' but {why}; fix that, or set sandbox.runtime: none to run the CLI unisolated"


def check_runtime(options: SandboxOptions, cli: str, where: str = "harness.preset_options.sandbox") -> None:
    """At the start of a run (once per runner): ``runtime: bwrap`` that cannot work fails here, before any
    session; ``runtime: auto`` that falls back to no isolation says so once, since the CLIs run with their
    permission checks off. ``cli`` names the CLI and its flag for that warning."""
    if options.runtime == "none":
        return
    why = bwrap_unusable()
    if why is None:
        return
    if options.runtime == "bwrap":
        raise HarnessError(_bwrap_required(why))
    log.warning("sandbox.runtime auto: %s, so %s runs with no isolation: it can read, change and reach whatever "
                "this user can. Make bubblewrap work, or set %s.runtime: none to run unisolated on purpose",
                why, cli, where)


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "-c", "user.name=polar", "-c", "user.email=polar@localhost",
         "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )


def git_baseline(workspace: Path) -> None:
    """Make ``workspace`` a git repo whose tag ``polar-base`` is its current content."""
    if not (workspace / ".git").exists():
        _git(workspace, "init", "-q")
    _git(workspace, "add", "-A")
    res = _git(workspace, "commit", "-q", "--allow-empty", "-m", "polar baseline")
    if res.returncode != 0:
        raise HarnessError(f"could not commit the workspace baseline in {workspace}: {res.stderr.strip()}")
    _git(workspace, "tag", "-f", BASE_TAG)


def workspace_diff(workspace: Path, base: str = BASE_TAG) -> str:
    """The session's change as a binary-safe patch (``git add -A && git diff --cached base``)."""
    excludes = [f":(exclude,glob)**/{p}" for p in DIFF_EXCLUDES] + [f":(exclude){p}" for p in DIFF_EXCLUDES]
    _git(workspace, "add", "-A", "--", ".", *excludes)
    res = _git(workspace, "diff", "--cached", "--binary", base, "--", ".", *excludes)
    if res.returncode != 0:
        raise HarnessError(f"git diff in {workspace} failed: {res.stderr.strip()}")
    return res.stdout


class HostRelay:
    """Host side of the isolated network: a Unix socket whose connections reach the gateway through a
    :class:`~polar.harness.agent.session_relay.SessionRelay`, which passes only this session's model calls.

    The in-sandbox relay (:mod:`polar.harness.agent.relay`) is untrusted, since the agent can connect to
    the socket itself: this side is the one that parses and filters every request."""

    def __init__(self, socket_path: Path, gateway_url: str, session_id: str) -> None:
        self.relay = SessionRelay(gateway_url, session_id)
        self.target = self.relay.target
        self.socket_path = socket_path
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="polar-host-relay", daemon=True)
        self._server: asyncio.AbstractServer | None = None

    def start(self) -> None:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self.relay.listen_unix(str(self.socket_path)), self._loop)
        self._server = fut.result(timeout=10)
        os.chmod(self.socket_path, 0o666)

    def stop(self) -> None:
        if self._server is not None and self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.relay.aclose(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()
        with contextlib.suppress(OSError):
            self.socket_path.unlink()


class Sandbox:
    """One session's sandbox. Use :meth:`create`, then :meth:`start` / :meth:`wrap` / :meth:`stop`."""

    def __init__(self, session_id: str, workspace: Path, root: Path, options: SandboxOptions) -> None:
        self.session_id = session_id
        self.workspace = workspace
        self.root = root  # private folder next to the workspace: home/, gw.sock
        self.home = root / "home"
        self.options = options
        self.use_bwrap = self._pick_runtime()
        self.isolated = self.use_bwrap and options.network == "gateway"
        self.uid = self._pick_uid()
        self._relay: HostRelay | None = None
        self._owner = (os.stat(workspace).st_uid, os.stat(workspace).st_gid)
        # AF_UNIX paths are capped at ~107 bytes: the socket lives in its own short folder
        self.socket_dir: Path | None = None
        if self.isolated:
            self.socket_dir = Path(tempfile.mkdtemp(prefix="pgw-", dir="/tmp" if Path("/tmp").is_dir() else None))
            os.chmod(self.socket_dir, 0o711)
        self.socket_path = (self.socket_dir or root) / "gw.sock"

    # -- setup --------------------------------------------------------------------------------
    @classmethod
    def create(cls, session_id: str, workspace: Path, source: Path | None = None,
               options: SandboxOptions | None = None, baseline: bool = True) -> Sandbox:
        """Copy ``source`` (the task's repo) into ``workspace``, commit the baseline (``baseline``: presets
        diff against it; a command harness's workspace stays as the pipeline made it), make a private HOME."""
        workspace = Path(workspace).absolute()  # bubblewrap binds need absolute paths; run folders are often relative
        workspace.mkdir(parents=True, exist_ok=True)
        if source is not None:
            if not source.is_dir():
                raise HarnessError(f"task repository {source} is not a directory; check the task's 'repo' field")
            shutil.copytree(source, workspace, dirs_exist_ok=True, symlinks=True,
                            ignore=shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache"))
        if baseline:
            git_baseline(workspace)
        root = Path(tempfile.mkdtemp(prefix=f".{session_id}-", dir=workspace.parent))
        try:
            sbx = cls(session_id, workspace, root, options or SandboxOptions())
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        sbx.home.mkdir()
        return sbx

    def _pick_runtime(self) -> bool:
        """bwrap when asked for or (``auto``) when it works; the run was told at start when it does not
        (:func:`check_runtime`)."""
        if self.options.runtime == "none":
            return False
        why = bwrap_unusable()
        if why is not None and self.options.runtime == "bwrap":
            raise HarnessError(_bwrap_required(why))
        return why is None

    def _pick_uid(self) -> int | None:
        if self.options.user == "current" or os.geteuid() != 0:
            return None
        why = None
        if shutil.which("setpriv") is None:
            why = "setpriv (util-linux) is not installed"
        elif not self.use_bwrap:
            # without bwrap the CLI sees the host paths, so every parent folder must let 'nobody' through
            blocked = [p for p in self.workspace.resolve().parents if not os.stat(p).st_mode & 0o001]
            if blocked:
                why = f"{blocked[0]} is not traversable by other users (mode {oct(os.stat(blocked[0]).st_mode & 0o777)})"
        if why is None:
            return NOBODY
        if self.options.user == "nobody":
            raise HarnessError(f"sandbox.user is 'nobody' but {why}; fix that or set sandbox.user: current")
        log.warning("session %s runs as the current user: %s", self.session_id, why)
        return None

    @property
    def report(self) -> dict[str, Any]:
        return {
            "runtime": "bwrap" if self.use_bwrap else "none",
            "network": "gateway-only" if self.isolated else "none" if self.options.network == "none" and self.use_bwrap
            else "host",
            "user": "nobody" if self.uid is not None else "current",
        }

    # -- run ----------------------------------------------------------------------------------
    def gateway_url(self, host_url: str) -> str:
        """The gateway root as the CLI must see it."""
        return f"http://127.0.0.1:{INNER_PORT}" if self.isolated else host_url

    def start(self, host_url: str) -> str:
        """Hand the session folders to the sandbox user and open the gateway route; returns the CLI's URL."""
        if self.uid is not None:
            for path in (self.workspace, self.root):
                _chown_tree(path, self.uid, self.uid)
        if self.isolated:
            self._relay = HostRelay(self.socket_path, host_url, self.session_id)
            self._relay.start()
        return self.gateway_url(host_url)

    def wrap(self, argv: list[str], ro_paths: list[str] | None = None) -> list[str]:
        """The command line that runs ``argv`` inside this sandbox.

        bubblewrap sets up the mounts with the caller's rights (so session folders under a private
        0700 parent still resolve), then ``setpriv`` drops to the sandbox user inside it.
        """
        inner: list[str] = []
        if self.uid is not None:
            inner += setpriv_args(self.uid)
        if not self.use_bwrap:
            return inner + argv
        if self.isolated:
            python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else os.path.realpath(shutil.which("python3") or "")
            inner += [python, "-I", "-S", str(RELAY_SCRIPT), "--listen", f"127.0.0.1:{INNER_PORT}", "--uds", str(self.socket_path), "--"]
        ro = [*(ro_paths or []), *self.options.ro_binds, str(RELAY_SCRIPT)]
        rw = [str(self.workspace), str(self.root), *([str(self.socket_dir)] if self.socket_dir else [])]
        b = bwrap_args(rw=rw, ro=ro, unshare_net=self.isolated or self.options.network == "none",
                       chdir=str(self.workspace))
        return b + inner + argv

    def stop(self) -> None:
        if self._relay is not None:
            self._relay.stop()
            self._relay = None
        if self.uid is not None:  # give the workspace back so the pipeline can diff, verify and delete it
            _chown_tree(self.workspace, *self._owner)
            _chown_tree(self.root, *self._owner)

    def diff(self) -> str:
        return workspace_diff(self.workspace)

    def cleanup(self) -> None:
        self.stop()
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        if not self.options.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def setpriv_args(uid: int) -> list[str]:
    """The prefix that drops to ``uid`` (its own group, no supplementary groups, no capabilities)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--"]


def bwrap_args(*, rw: list[str], ro: list[str], unshare_net: bool, chdir: str, tmp_size_mb: int = TMP_SIZE_MB,
               shm_size_mb: int = SHM_SIZE_MB) -> list[str]:
    """The bubblewrap command line (up to and including ``--``) of a sandbox that sees a read-only system
    (``/usr``, ``/etc``, ``/bin``, ``/lib*``), a fresh ``/tmp``, ``/proc`` and ``/dev``, the ``ro`` paths
    read-only and the ``rw`` paths read-write, and nothing else of the host; with ``unshare_net`` it has
    only its own loopback. Shared by the agent sandbox and the verifiers that run a workspace's code.

    ``/tmp`` and ``/dev/shm`` are the sandbox's own tmpfs, sticky and writable by any user (``nobody``
    included: bwrap makes them as root), capped at ``tmp_size_mb`` / ``shm_size_mb``. Without that, code
    that needs a temp folder falls back to its working folder, and a Unix socket there can pass the 107-byte
    AF_UNIX path limit (``polar check`` of a generated connector did). A bubblewrap that cannot cap a tmpfs
    (before 0.8, or installed setuid) keeps them root's and uncapped, as they were (logged once)."""
    b = [bwrap_path() or "bwrap", "--die-with-parent", "--new-session", "--unshare-pid",
         "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if os.geteuid() != 0:
        b.append("--unshare-user")
    if unshare_net:
        b.append("--unshare-net")
    b += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/" + top)
        if p.is_symlink():
            b += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            b += ["--ro-bind", str(p), str(p)]
    b += ["--proc", "/proc", "--dev", "/dev"]
    sized = _bwrap_sized_tmpfs(b[0])
    for mount, size_mb in (("/tmp", tmp_size_mb), ("/dev/shm", shm_size_mb)):
        b += [*(["--perms", "1777", "--size", str(size_mb << 20)] if sized else []), "--tmpfs", mount]
    ro = [p for p in dict.fromkeys(ro) if Path(p).exists()]
    # bwrap makes missing mount points 0700 when run as root; the sandbox user must traverse them
    made: set[str] = {"/", "/tmp", "/usr", "/etc", "/proc", "/dev"}
    for path in [*ro, *rw]:
        for parent in reversed(Path(path).parents):
            if str(parent) not in made and not str(parent).startswith(("/usr/", "/etc/", "/proc/", "/dev/")):
                made.add(str(parent))
                b += ["--perms", "0755", "--dir", str(parent)]
    for path in ro:
        b += ["--ro-bind", path, path]
    for path in rw:
        b += ["--bind", path, path]
    return [*b, "--chdir", chdir, "--"]


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (dirpath, *[os.path.join(dirpath, n) for n in dirnames + filenames]):
            with contextlib.suppress(OSError):
                os.lchown(name, uid, gid)


_BWRAP_SIZED: dict[str, bool] = {}


def _bwrap_sized_tmpfs(bwrap: str) -> bool:
    """Whether ``bwrap`` takes ``--perms`` and ``--size`` for a tmpfs (0.8+, not setuid); tried once."""
    if bwrap not in _BWRAP_SIZED:
        argv = [bwrap, "--ro-bind", "/", "/", *(["--unshare-user"] if os.geteuid() != 0 else []),
                "--perms", "1777", "--size", str(1 << 20), "--tmpfs", "/tmp", "--", "true"]
        try:
            res = subprocess.run(argv, capture_output=True, timeout=20)
            _BWRAP_SIZED[bwrap] = res.returncode == 0
            why = res.stderr.decode(errors="replace").strip() or f"exit code {res.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            _BWRAP_SIZED[bwrap] = False
            why = f"{type(e).__name__}: {e}"
        if not _BWRAP_SIZED[bwrap]:
            log.warning("bubblewrap (%s) cannot make a capped tmpfs (%s; it needs bubblewrap 0.8+, not setuid): the "
                        "sandbox's /tmp and /dev/shm stay uncapped and, for a sandbox user other than the caller, "
                        "read-only", bwrap, why)
    return _BWRAP_SIZED[bwrap]


_BWRAP_OK: dict[str, bool] = {}
_BWRAP_ERR: dict[str, str] = {}  # why a bwrap binary failed its trial run


def _bwrap_works(bwrap: str) -> bool:
    """bubblewrap may be installed yet unable to create namespaces (containers, sysctl); try once."""
    if bwrap not in _BWRAP_OK:
        try:
            res = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-user", "--unshare-net", "--", "true"],
                                 capture_output=True, timeout=20)
            _BWRAP_OK[bwrap] = res.returncode == 0
            if res.returncode != 0:
                _BWRAP_ERR[bwrap] = res.stderr.decode(errors="replace").strip() or f"exit code {res.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            _BWRAP_OK[bwrap] = False
            _BWRAP_ERR[bwrap] = f"{type(e).__name__}: {e}"
    return _BWRAP_OK[bwrap]
