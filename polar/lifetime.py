"""Child processes that die with the process that started them, even when that one is SIGKILLed.

A SIGKILLed process runs no ``finally``, no ``atexit`` and no signal handler, so the cleanup code of a
run cannot be what ends its children. Two mechanisms do it instead:

- **parent-death signal** (Linux ``prctl(PR_SET_PDEATHSIG)``): armed in the child between fork and exec,
  the kernel sends the child SIGKILL when its parent goes. It fires when the *thread* that forked the
  child exits, not only the process, so ``popen_tied`` forks from one long-lived spawner thread: a
  connector restarted from a short-lived thread would otherwise be killed when that thread ends.
- **a pipe whose EOF ends the child** (``exit_when_closed``): for children whose parent is not the
  process they serve (multiprocessing forkserver children: their parent is the fork server, which
  itself lives as long as they do), the learner keeps the only write end of a pipe and the child
  exits when reading it returns EOF, which the kernel delivers the moment the learner is gone.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None


_PRCTL = _load_prctl()  # resolved here, in the parent: the child between fork and exec only calls it
_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_pid = 0
_spawner_lock = threading.Lock()


def parent_death_hook(then: Callable[[], None] | None = None,
                      signum: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` that arms the parent-death signal, then runs ``then`` (another preexec hook).

    Built in the parent (it records the parent's pid); the child exits at once when the parent died
    before the signal was armed, a window the kernel would otherwise leave open.
    """
    parent = os.getpid()
    prctl = _PRCTL

    def hook() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)
        if then is not None:
            then()

    return hook


def _spawn_thread() -> concurrent.futures.ThreadPoolExecutor:
    """One spawner thread per process (recreated in a forked child, which inherits no threads)."""
    global _spawner, _spawner_pid
    with _spawner_lock:
        if _spawner is None or _spawner_pid != os.getpid():
            _spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="polar-spawner")
            _spawner_pid = os.getpid()
        return _spawner


def popen_tied(args: list[str], *, pdeathsig: int = signal.SIGKILL, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)`` whose child gets ``pdeathsig`` (SIGKILL) when this process dies.

    A ``preexec_fn`` in ``kwargs`` still runs (after the signal is armed). A catchable ``pdeathsig``
    (SIGTERM) suits children that must take their own children down with them (a vLLM server).
    """
    kwargs["preexec_fn"] = parent_death_hook(kwargs.get("preexec_fn"), pdeathsig)
    return _spawn_thread().submit(lambda: subprocess.Popen(args, **kwargs)).result()


def exit_when_closed(conn: Any, before_exit: Callable[[], None] | None = None, name: str = "polar-parent-watch") -> None:
    """Exit this process (code 1) once ``conn`` (a multiprocessing read-only Connection) reaches EOF.

    Nothing is ever sent on it: the read returns only when the last write end closes, that is when the
    process holding it is gone. ``before_exit`` (best effort) ends what this process started itself.
    """

    def watch() -> None:
        while True:
            try:
                conn.recv()
            except (EOFError, OSError):
                break
        log.warning("pid %d: the process it serves is gone; exiting", os.getpid())
        if before_exit is not None:
            try:
                before_exit()
            except BaseException:  # exiting regardless
                pass
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name=name).start()
