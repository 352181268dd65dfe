"""Same-host fast path for connector steps: actions and replies in one shared file mapping.

A blocking socket round trip costs two scheduler wake-ups (one per side), which on a small VM is most
of a batch of 16 CartPole steps. When both sides offer it (docs/connector-protocol.md, section 4.7), a
step's actions, observations, rewards and flags are raw fixed-layout numpy buffers in a file both
processes map; each side publishes a request or reply by bumping a sequence counter and the other
side polls that counter for a bounded time (``SPIN_S``, yielding the CPU on every poll) before it
blocks on the socket as before. So an idle box never pays a wake-up, and a loaded one never burns a
core: past the spin, the waiter sets its ``waiting`` flag and sleeps in ``select`` on the socket, and
the publisher sends a 4-byte empty frame (a *wake*) when it sees that flag. The socket stays the
liveness channel: a dead peer closes it, which ends the sleep at once; a hung one runs into the
caller's deadline. Everything that is not a plain step (reset, ping, close, errors, non-empty infos)
still travels as a frame, announced by the counter with kind ``KIND_FRAME``.

Ordering relies on x86-64's in-order stores (a payload written before its counter is seen before
it); other machines keep the socket path (``supported()``). Nothing is unpickled: the layout is
fixed by polar in the ``shared_memory`` request and both sides only read numbers from it.
"""

from __future__ import annotations

import mmap
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from polar.errors import ConnectorTimeout
from polar.harness.connector.wire import FrameSocket

SHM_VERSION = 1
HEADER_BYTES = 128
# int64 slots of the header; polar writes the first cache line, the connector the second
REQ_SEQ, REQ_KIND, POLAR_WAITING = 0, 1, 2
REP_SEQ, REP_KIND, CONNECTOR_WAITING = 8, 9, 10
SLOTS = {"req_seq": REQ_SEQ, "req_kind": REQ_KIND, "polar_waiting": POLAR_WAITING,
         "rep_seq": REP_SEQ, "rep_kind": REP_KIND, "connector_waiting": CONNECTOR_WAITING}
KIND_SHARED = 0  # the request or reply is in the mapping
KIND_FRAME = 1  # the request or reply is the next frame on the socket
SPIN_S = 300e-6  # poll the counter this long before sleeping on the socket (a 16-copy CartPole step: ~0.1 ms)
RECHECK_S = 1e-3  # the first sleep is this short: a wake lost to store-load reordering costs at most this
MAX_SKIP = 64  # after spins that came to nothing, up to this many waits sleep at once (a loaded box, a slow peer)
FIELDS = ("actions", "obs", "final_obs", "rewards", "terminated", "truncated")
_ALIGN = 64


def supported() -> bool:
    """Whether this machine orders plain stores as the counters need (x86-64) and has ``mmap``."""
    return platform.machine().lower() in ("x86_64", "amd64") and hasattr(os, "sched_yield")


@dataclass(frozen=True)
class Field:
    """Where one array lives in the mapping: byte offset, numpy dtype string, shape."""

    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))

    def to_wire(self) -> dict[str, Any]:
        return {"offset": self.offset, "dtype": self.dtype, "shape": list(self.shape)}


def layout(num_envs: int, action: tuple[tuple[int, ...], np.dtype], obs: tuple[tuple[int, ...], np.dtype]
           ) -> tuple[dict[str, Field], int]:
    """The fields of a mapping for ``num_envs`` copies, given the batched action and observation shape and dtype."""
    specs = {
        "actions": action, "obs": obs, "final_obs": obs, "rewards": ((num_envs,), np.dtype("<f8")),
        "terminated": ((num_envs,), np.dtype("|u1")), "truncated": ((num_envs,), np.dtype("|u1")),
    }
    fields, offset = {}, HEADER_BYTES
    for name in FIELDS:
        shape, dtype = specs[name]
        field = Field(offset, np.dtype(dtype).str, tuple(int(d) for d in shape))
        fields[name] = field
        offset += -(-max(field.nbytes, 1) // _ALIGN) * _ALIGN
    return fields, offset


def fields_from_wire(desc: Any) -> dict[str, Field]:
    """The ``fields`` map of a ``shared_memory`` request; ValueError names what is wrong."""
    if not isinstance(desc, dict) or set(desc) != set(FIELDS):
        raise ValueError(f"shared_memory fields must be a map with keys {list(FIELDS)}")
    out = {}
    for name in FIELDS:
        f = desc[name]
        dtype = np.dtype(str(f["dtype"]))
        if dtype.kind not in "biuf" or dtype.hasobject:
            raise ValueError(f"shared_memory field {name!r}: dtype {dtype.str} is not a number type")
        out[name] = Field(int(f["offset"]), dtype.str, tuple(int(d) for d in f["shape"]))
    return out


class SharedReply(dict):  # type: ignore[type-arg]
    """A step reply read from the mapping: its shapes and dtypes are the layout's, so it needs no shape check."""


class SharedSteps:
    """One side's view of the mapping: the header counters and the step arrays."""

    def __init__(self, buf: mmap.mmap, fields: dict[str, Field]) -> None:
        for name, f in fields.items():
            if f.offset < HEADER_BYTES or f.offset + f.nbytes > len(buf):
                raise ValueError(f"shared_memory field {name!r} lies outside the {len(buf)}-byte mapping")
        self._buf = buf
        self.size = len(buf)
        self.slots = memoryview(buf)[:HEADER_BYTES].cast("q")
        self.arrays = {name: np.ndarray(f.shape, np.dtype(f.dtype), buffer=buf, offset=f.offset)
                       for name, f in fields.items()}
        self.fields = fields
        self._skip = 0  # waits left that sleep without spinning
        self._backoff = 0  # how many waits to skip after the next spin that comes to nothing

    @classmethod
    def create(cls, num_envs: int, action: tuple[tuple[int, ...], np.dtype],
               obs: tuple[tuple[int, ...], np.dtype]) -> tuple[SharedSteps, str]:
        """A fresh mapping in a private folder (``/dev/shm`` where there is one); the caller unlinks the file
        once the connector has mapped it."""
        fields, size = layout(num_envs, action, obs)
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        folder = tempfile.mkdtemp(prefix="polar-shm-", dir=base)
        path = os.path.join(folder, "steps")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(buf, fields), path

    @classmethod
    def attach(cls, path: str, size: int, fields: dict[str, Field]) -> SharedSteps:
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != size:
                raise ValueError(f"shared_memory file {path} is {os.fstat(fd).st_size} bytes, expected {size}")
            buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(buf, fields)

    @staticmethod
    def remove(path: str) -> None:
        """Unlink the file and its private folder (the mappings live on until both sides drop them)."""
        for remove, target in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
            try:
                remove(target)
            except OSError:
                pass

    def publish(self, seq_slot: int, kind_slot: int, kind: int, seq: int) -> None:
        """Announce a request or reply: kind first, the counter last (the peer reads them in that order)."""
        self.slots[kind_slot] = kind
        self.slots[seq_slot] = seq

    def wait(self, seq_slot: int, old: int, waiting_slot: int, conn: FrameSocket, deadline: float | None,
             spin_s: float = SPIN_S) -> int:
        """Wait until the counter at ``seq_slot`` moves off ``old``; return its new value.

        Polls for ``spin_s`` (yielding the CPU between polls), then sets the ``waiting`` flag and sleeps on
        the socket: a wake frame, a real frame or the peer closing it ends the sleep
        (``ConnectionClosed``); ``deadline`` (``time.monotonic()``) raises ``ConnectorTimeout``. A spin that
        comes to nothing (the peer is slower than ``spin_s``, or waits for a CPU) makes the next 1, 2, 4, ...
        up to ``MAX_SKIP`` waits sleep at once; one that succeeds brings spinning back for every wait.
        """
        slots = self.slots
        seq: int = slots[seq_slot]
        if seq != old:
            return seq
        if self._skip:
            self._skip -= 1
        else:
            end = time.perf_counter() + spin_s
            while time.perf_counter() < end:
                os.sched_yield()
                seq = slots[seq_slot]
                if seq != old:
                    self._backoff = 0
                    return seq
            self._backoff = min(2 * self._backoff or 1, MAX_SKIP)
            self._skip = self._backoff
        slots[waiting_slot] = 1
        try:
            timeout: float | None = RECHECK_S
            while True:
                seq = slots[seq_slot]
                if seq != old:
                    return seq
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ConnectorTimeout("timed out waiting for a reply")
                    timeout = min(timeout, remaining) if timeout is not None else remaining
                if conn.readable(timeout):
                    conn.drain()
                timeout = None  # after the first recheck the flag is long visible: a wake frame always comes
        finally:
            slots[waiting_slot] = 0

