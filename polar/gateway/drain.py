"""Weight-sync drain: pause new generation, let in-flight calls finish, swap weights, resume.

While paused, a new call either waits for resume (``pause_mode: wait``, up to ``pause_wait_s``) or
gets a 429 with ``Retry-After`` at once (``pause_mode: reject``); SDK clients retry those by
themselves. Every call takes its policy version when it starts, and no call is in flight across a
swap, so each record's ``policy_version`` is the version that generated all of its tokens. With
``sync.in_flight: continue`` (partial rollouts) the gate is not paused at all: the calls go on across the
swap, and each token's version comes from the engine (``CallRecord.sampled_versions``).
"""

from __future__ import annotations

import asyncio
import math

from polar.gateway.errors import ApiError


class DrainGate:
    """Counts in-flight calls and blocks new ones while paused. Lives on the server's event loop."""

    def __init__(self, mode: str = "wait", wait_s: float = 30.0, retry_after_s: float = 1.0) -> None:
        self.mode = mode
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self.paused = False
        self.inflight = 0
        self.waiting = 0  # calls held at the gate until resume (pause_mode: wait)
        self._resumed: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._resumed is None or self._idle is None:
            self._resumed, self._idle = asyncio.Event(), asyncio.Event()
            self._resumed.set()
            self._idle.set()
        return self._resumed, self._idle

    def _busy(self) -> ApiError:
        return ApiError(
            "rate_limited",
            "generation is paused for a weight update; retry after the Retry-After delay",
            retry_after_s=self.retry_after_s,
        )

    async def enter(self) -> None:
        resumed, idle = self._events()
        if self.paused:
            if self.mode == "reject":
                raise self._busy()
            self.waiting += 1
            try:
                await asyncio.wait_for(resumed.wait(), self.wait_s)
            except asyncio.TimeoutError:
                raise self._busy() from None
            finally:
                self.waiting -= 1
        self.inflight += 1
        idle.clear()

    def exit(self) -> None:
        self.inflight -= 1
        if self.inflight <= 0:
            self.inflight = 0
            self._events()[1].set()

    async def pause(self, timeout_s: float) -> dict[str, object]:
        """Stop admitting calls and wait (bounded) until none is in flight."""
        resumed, idle = self._events()
        self.paused = True
        resumed.clear()
        try:
            await asyncio.wait_for(idle.wait(), max(0.0, timeout_s))
        except asyncio.TimeoutError:
            pass
        return self.status()

    def resume(self) -> dict[str, object]:
        self.paused = False
        self._events()[0].set()
        return self.status()

    def status(self) -> dict[str, object]:
        return {"paused": self.paused, "inflight": self.inflight, "waiting": self.waiting,
                "drained": self.paused and self.inflight == 0}


def retry_after_header(seconds: float | None) -> str:
    return str(max(1, math.ceil(seconds or 1)))
