"""How a run ends, and what its ``run.json`` says about it, whichever way it ends.

Every exit path writes a final status: ``finished``; ``failed`` with the error; ``interrupted`` (Ctrl-C or
SIGTERM) with the final checkpoint, or a note that none was written. A run that is SIGKILLed, loses
power or runs out of memory writes nothing; ``RunDir.status()`` reports it as ``killed`` because the
process recorded in ``run.json`` (pid, host, start time) is gone.

Ctrl-C and SIGTERM stop a training loop at an iteration boundary, so the final checkpoint is a consistent
state and not one taken halfway through an update:

- the first Ctrl-C asks the loop to stop: it finishes its iteration, writes a checkpoint and exits 130;
  a second Ctrl-C stops at once, without a checkpoint;
- SIGTERM does the same within ``logging.sigterm_grace_s``; when the grace period runs out first, the run
  stops without a checkpoint (exit 143) and ``run.json`` says so.

Outside a training loop (setting up, the final evaluation) both stop at once. ``run_guard`` installs the
handlers and records the status; the loops call ``stop_requested()`` between iterations inside
``deferred_stop()``. Without ``run_guard`` (a trainer driven from a test or a notebook) nothing is deferred.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

HARD_EXIT_AFTER_S = 30.0  # after the grace period, how long cleanup may take before the process exits anyway


class Stopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM ended the run; ``checkpoint`` is the final checkpoint written, or None.

    A ``KeyboardInterrupt`` so that code which cleans up on Ctrl-C cleans up on SIGTERM too; the CLI
    prints ``str(self)`` and exits with ``exit_code`` (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signame: str, message: str, checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.signame = signame
        self.message = message
        self.checkpoint = checkpoint

    @property
    def exit_code(self) -> int:
        return 128 + int(getattr(signal, self.signame, signal.SIGINT))

    def __str__(self) -> str:
        return self.message


class _StopState:
    """Process-wide (signals are): which stop was asked for, and whether a loop is there to honour it."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requested: str | None = None
        self.deferring = 0
        self.grace_s = 30.0
        self.on_abandon: Any = None  # called from the grace timer just before a hard exit
        self.grace_expired = False


_STATE = _StopState()


def stop_requested() -> str | None:
    """``"SIGINT"`` or ``"SIGTERM"`` once a stop was asked for, else None. Loops check it between iterations."""
    return _STATE.requested


@contextlib.contextmanager
def deferred_stop() -> Iterator[None]:
    """Inside this block a first Ctrl-C / SIGTERM only sets ``stop_requested()``; the loop stops itself."""
    _STATE.deferring += 1
    try:
        yield
    finally:
        _STATE.deferring -= 1


def _handler(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    st = _STATE
    if st.grace_expired:
        raise Stopped(name, f"SIGTERM: no checkpoint within the grace period of {st.grace_s:g} s "
                            "(logging.sigterm_grace_s); stopped without one")
    if st.requested is not None or not st.deferring:
        what = "Ctrl-C" if name == "SIGINT" else name
        raise Stopped(name, f"interrupted by {what}" + (" again" if st.requested == name else "")
                      + "; stopped without a final checkpoint")
    st.requested = name
    if name == "SIGINT":
        log.warning("Ctrl-C: finishing this iteration, then a final checkpoint (Ctrl-C again to stop now, without one)")
        return
    log.warning("SIGTERM: finishing this iteration, then a final checkpoint (at most %g s: logging.sigterm_grace_s)",
                st.grace_s)
    threading.Thread(target=_grace_timer, args=(st.grace_s,), daemon=True, name="polar-sigterm-grace").start()


def _grace_timer(grace_s: float) -> None:
    """At the end of the grace period, stop the main thread; if even that hangs, exit the process."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        if _STATE.requested is None:  # the run ended (run_guard reset the state)
            return
    _STATE.grace_expired = True
    # a real signal to the main thread: it also breaks a blocking call (a hung env's sleep, a socket read),
    # where _thread.interrupt_main would wait for the call to return; _handler then raises Stopped there
    main = threading.main_thread().ident
    assert main is not None  # the main thread has started: this timer runs beside it
    signal.pthread_kill(main, signal.SIGTERM)
    time.sleep(HARD_EXIT_AFTER_S)
    if _STATE.on_abandon is not None:
        with contextlib.suppress(Exception):
            _STATE.on_abandon()
    log.error("SIGTERM: still not stopped %g s after the grace period; exiting now", HARD_EXIT_AFTER_S)
    os._exit(143)


@contextlib.contextmanager
def run_guard(run_dir: Any, sigterm_grace_s: float = 30.0) -> Iterator[None]:
    """Record this process as the run's owner (status ``running``), handle Ctrl-C / SIGTERM as the module
    docstring says, and write the final status however the block ends.

    A block that ends normally is ``finished`` unless it wrote a status of its own (trainers write
    ``finished`` with their result)."""
    main = threading.current_thread() is threading.main_thread()
    previous = {}
    if main:
        _STATE.reset()
        _STATE.grace_s = sigterm_grace_s
        _STATE.on_abandon = lambda: _record(run_dir, status="interrupted", signal="SIGTERM", checkpoint=None,
                                            error="SIGTERM: cleanup hung after the grace period; exited hard")
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _handler)
    run_dir.mark_running()
    try:
        yield
    except Stopped as e:
        _record(run_dir, status="interrupted", signal=e.signame, checkpoint=e.checkpoint, error=e.message)
        raise
    except KeyboardInterrupt:
        _record(run_dir, status="interrupted", signal="SIGINT", checkpoint=None,
                error="interrupted by Ctrl-C; stopped without a final checkpoint")
        raise
    except BaseException as e:
        _record(run_dir, status="failed", error=one_line_error(e))
        raise
    else:
        with contextlib.suppress(Exception):
            if run_dir.read_meta().get("status") != "finished":
                _record(run_dir, status="finished")
    finally:
        if main:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            _STATE.reset()


def stopped_after_checkpoint(signame: str, run_path: Any, checkpoint: Any, where: str) -> Stopped:
    """The ``Stopped`` a loop raises once it wrote its final checkpoint after Ctrl-C / SIGTERM."""
    what = "Ctrl-C" if signame == "SIGINT" else signame
    if checkpoint is None:
        return Stopped(signame, f"interrupted by {what} after {where}; no checkpoint was written")
    return Stopped(signame, f"interrupted by {what} after {where}; final checkpoint {checkpoint}. "
                            f"Continue with `polar resume {run_path}`", checkpoint=str(checkpoint))


def one_line_error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _record(run_dir: Any, **changes: Any) -> None:
    """Write a final status; a run directory that cannot be written (full disk) must not hide the real error."""
    try:
        run_dir.update_meta(ended=time.time(), **changes)
    except Exception as e:
        log.warning("could not record status %r in %s: %s", changes.get("status"), run_dir.path, e)
