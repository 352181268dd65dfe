"""The supervisor a connector runs under: its whole process tree dies with it, and it dies with polar.

polar never starts a connector directly. It starts this script (``python -I -S supervisor.py FD -- CMD...``)
which starts CMD as its only child and stays between the two, because a process group is not a
container: a connector's child that calls ``setsid()``, or a daemon that double-forks, leaves the group
and is reparented to init, out of polar's reach. The supervisor closes that gap with two kernel features:

- it is a **child subreaper** (``prctl(PR_SET_CHILD_SUBREAPER)``): every process of the connector's tree
  whose parent dies is reparented to the supervisor, not to init, whatever session it moved to. So the
  tree is exactly the supervisor's descendants, and "no child left" means "nothing of the tree left";
- it gets **SIGTERM when polar dies** (``PR_SET_PDEATHSIG``, armed by polar between fork and exec from
  its long-lived spawner thread, see ``polar.lifetime``), including when polar is SIGKILLed.

On SIGTERM (polar stopping the connector, or polar gone), or when the connector itself exits, the
supervisor SIGKILLs every descendant and reaps until it has no child left, then exits: with the
connector's exit code or by the signal that killed it, so polar's messages stay the connector's.

The connector's pid goes to polar on the pipe ``FD`` (4 bytes, native order). The child gets SIGKILL as
its own parent-death signal, so even a SIGKILLed supervisor takes its direct child down.

It imports nothing but the standard library and runs isolated (``-I -S``): it starts in a few ms and
nothing from the connector's environment (``PYTHONPATH``, a ``sitecustomize``) runs in it. What it
does not stop: a descendant that SIGKILLs the supervisor itself (same user) frees its own descendants;
only a pid namespace or a cgroup closes that, which are not available everywhere.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PID_BYTES = struct.Struct("=i")
EXIT_NOT_STARTED = 127
ROLE = "connector_supervisor"  # POLAR_ROLE of the supervisor (polar.metrics.system)
ROLE_VARIABLE = "POLAR_SUPERVISED_ROLE"  # the POLAR_ROLE its child gets
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_RESTORED_SIGNALS = ("SIGPIPE", "SIGXFZ", "SIGXFSZ")  # Python ignores these; a child gets the default back


class _Stop(Exception):
    """Raised by the signal handler to leave a blocking wait."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_stop_signum: int | None = None  # the first stop signal; 0 once the supervisor is stopping anyway


def _on_signal(signum: int, _frame: object) -> None:
    global _stop_signum
    if _stop_signum is None:  # raise once: a second signal must not interrupt the cleanup
        _stop_signum = signum
        raise _Stop(signum)


def _descendants(root: int) -> list[int]:
    """Every live process under ``root``, read from ``/proc/*/stat`` (no /proc children file needed)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs (not Linux): only the connector itself is known, see kill_tree
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    stack = [root]
    while stack:
        for pid in children.get(stack.pop(), ()):
            out.append(pid)
            stack.append(pid)
    return out


def kill_tree(child: int = 0) -> None:
    """SIGKILL every descendant (and ``child``, the connector when it is not reaped yet) and reap until no
    child is left.

    As a subreaper the supervisor inherits each orphan of the tree, so once ``waitpid`` says there is no
    child there is no descendant either; a process forked between a scan and its parent's death is
    reparented here and caught by the next scan.
    """
    me = os.getpid()
    while True:
        for pid in {*_descendants(me), *([child] if child else [])}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        if pid == child:
            child = 0  # reaped: its pid may be reused


def _exit_like(status: int) -> None:
    """Exit as the connector did: with its exit code, or killed by the same signal (without a core dump), so
    polar reports ``exit code 3`` or ``-11`` as it would for the connector itself."""
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if signum != signal.SIGKILL:  # SIGKILL has no handler to reset
                signal.signal(signum, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
            os.kill(os.getpid(), signum)
        except (OSError, ValueError):  # a signal that cannot be re-raised here: the shell's convention
            pass
        os._exit(128 + signum)
    os._exit(1)


def _start_child(argv: list[str], prctl: object) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: default signals, SIGKILL when the supervisor goes, then the connector
        for name in ("SIGTERM", "SIGINT", "SIGHUP", *_RESTORED_SIGNALS):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # type: ignore[operator]
        env = dict(os.environ)
        role = env.pop(ROLE_VARIABLE, None)
        if role:  # system metrics name the connector by its role, and the supervisor by its own
            env["POLAR_ROLE"] = role
        os.execvpe(argv[0], argv, env)
    except BaseException as e:  # exec failed: say why on the output polar quotes, then exit 127
        msg = f"polar connector supervisor: cannot start {argv[0]!r}: {getattr(e, 'strerror', None) or e}\n"
        os.write(2, msg.encode("utf-8", "replace"))
    os._exit(EXIT_NOT_STARTED)


def main(args: list[str]) -> None:
    global _stop_signum
    if len(args) < 4 or args[2] != "--":
        os.write(2, b"usage: supervisor.py PID_FD PARENT_PID -- COMMAND [ARGS...]\n")
        os._exit(2)
    pid_fd, parent, argv = int(args[0]), int(args[1]), args[3:]
    status: int | None = None
    child = 0
    try:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, _on_signal)
        prctl = None
        if sys.platform.startswith("linux"):
            try:
                prctl = ctypes.CDLL(None, use_errno=True).prctl
            except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
                prctl = None
        if prctl is not None:
            prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)  # polar armed it too; again, now that it is caught
        if os.getppid() != parent:  # polar died before the handler was installed: its signal is lost
            raise _Stop(signal.SIGTERM)
        child = _start_child(argv, prctl)
        try:
            os.write(pid_fd, PID_BYTES.pack(child))
            os.close(pid_fd)
        except OSError:  # polar stopped listening; the connector runs regardless
            pass
        while status is None:
            pid, st = os.waitpid(-1, 0)  # the connector, or an orphan of its tree to reap
            if pid == child:
                status, child = st, 0
        _stop_signum = 0  # from here on a stop signal changes nothing: the tree is killed below
    except _Stop as stop:
        _stop_signum = stop.signum
    kill_tree(child)  # stopped, or the connector is gone: so is everything it left behind
    if status is None:
        os._exit(128 + (_stop_signum or signal.SIGTERM))
    _exit_like(status)


if __name__ == "__main__":
    main(sys.argv[1:])
