"""Helpers for the tests that run a real vLLM (``-m vllm``)."""

from __future__ import annotations

import os
import select
import time


def live_group_members(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in process group ``pgid``, read from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def wait_group_gone(pgid: int, timeout_s: float = 60.0) -> list[int]:
    """Wait (bounded) until process group ``pgid`` has no live member; returns what is left (empty: gone).

    Waits on each member's pidfd, which becomes readable when that process exits."""
    deadline = time.monotonic() + timeout_s
    for pid in live_group_members(pgid):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
    return live_group_members(pgid)
