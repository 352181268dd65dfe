"""A line every ``every_s`` while a long stage runs and nothing else has said anything.

An LLM learner's update, a weight push or an evaluation can take minutes on a loaded CPU; without this the run's
log goes quiet meanwhile, and a quiet run looks like a hung one. The parts that already report their own
progress (the session collector, the held-out evaluation) keep the heartbeat silent: it speaks only when no
``polar`` log line was written for ``every_s``. Entering and leaving a stage sets one field, so the loop's
per-update cost is a tuple assignment; one daemon thread watches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

HEARTBEAT_S = 30.0  # the longest a run is silent while one of its stages runs
POLL_S = 1.0


class _LastLine(logging.Handler):
    """Notes when the ``polar`` logger last passed a record on (any level, any child logger)."""

    def __init__(self) -> None:
        super().__init__(level=logging.NOTSET)
        self.at = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        self.at = time.monotonic()


class Heartbeat:
    """``with heartbeat.doing("iteration 18: updating the policy"): ...`` logs "iteration 18: updating the
    policy, still running after 30s" when the block has run ``every_s`` with no other ``polar`` line since its
    start or the last line; ``close()`` stops the thread."""

    def __init__(self, every_s: float | None = None, logger_name: str = "polar") -> None:
        self.every_s = float(HEARTBEAT_S if every_s is None else every_s)
        self._current: tuple[str, float] | None = None
        self._logger = logging.getLogger(logger_name)
        self._last = _LastLine()
        self._logger.addHandler(self._last)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="polar-heartbeat", daemon=True)
        self._thread.start()

    @contextmanager
    def doing(self, what: str) -> Iterator[None]:
        outer = self._current
        self._current = (what, time.monotonic())
        try:
            yield
        finally:
            self._current = outer

    def _watch(self) -> None:
        while not self._stop.wait(min(POLL_S, self.every_s)):
            current = self._current
            if current is None:
                continue
            what, since = current
            now = time.monotonic()
            if now - max(since, self._last.at) >= self.every_s:
                log.info("%s, still running after %.0fs", what, now - since)  # resets _last.at: once per every_s

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._logger.removeHandler(self._last)
