"""Per-session call records: append-only JSONL files in the run directory, plus an in-memory index.

Layout: ``<records_dir>/<file id>.jsonl``, one ``CallRecord`` per line. A record is built, indexed and
written once its call's response has gone out (``responding``: right after the last byte is sent; else on
the next turn of the event loop), so none of that work is on the request's critical path. The call hands
its record over (``defer``) before its response ends, and anything that reads the store (the session's
next call, ``GET /sessions/{id}``, ``records``) builds pending records before it reads, so no reader of
the store misses one; the file is a moment behind (``flush`` writes it now). A crash loses at most the
records of the responses just sent; with ``fsync=True`` every record is written and fsynced before the
call returns. The file id is the session id when it
is filename-safe, otherwise a hash of it. An API key never reaches disk: a session named by a key gets
the id ``key_session_id(key)`` (a hash), and its owner is recorded as ``key_hash(key)``.

Ownership: the key of a session's first call owns it (``claim``); each record carries the owner's hash
in ``metadata["owner"]``, so ownership survives a restart. The app decides who may read or append.

A gateway restarted on a directory that already holds sessions refuses to start unless told to resume
them (``resume=True``, ``polar gateway --resume-records``); then it indexes the sessions' ids and owners
and reloads each session lazily, so call indices and token reuse continue where they stopped.

Isolation: every lookup is keyed by the session id; the reuse index of one session never sees another
session's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from polar.errors import GatewayError
from polar.types import SESSION_KEY_PREFIX, CallRecord, secret_key_session_id
from polar.types import session_key as session_key  # a client names its session with it (docs/gateway.md)

log = logging.getLogger(__name__)

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_SESSION_ID_CHARS = 128
SESSION_ID_CHARS = "A-Z a-z 0-9 . _ : @ / -"  # what a session id may hold (docs/gateway.md, Limits)
_SESSION_ID = re.compile(rf"[A-Za-z0-9._:@/-]{{1,{MAX_SESSION_ID_CHARS}}}")


def session_id_problem(session_id: str) -> str | None:
    """Why ``session_id`` cannot name a session, or ``None``. Ids go into response headers, file names
    and logs, so they are checked before a call is admitted: printable ASCII from a small set."""
    if _SESSION_ID.fullmatch(session_id):
        return None
    shown = repr(session_id[:60]) + ("..." if len(session_id) > 60 else "")
    if len(session_id) > MAX_SESSION_ID_CHARS:
        return f"session id {shown} is {len(session_id)} characters long; the most is {MAX_SESSION_ID_CHARS}"
    return f"session id {shown} must be 1-{MAX_SESSION_ID_CHARS} characters from {SESSION_ID_CHARS}"


def file_id(session_id: str) -> str:
    if _SAFE.match(session_id) and not session_id.startswith("sk-"):
        return session_id
    return "h-" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


def key_hash(key: str) -> str:
    """A one-way name for an API key (128 bits of SHA-256): what records hold instead of the key."""
    return hashlib.sha256(b"polar-gateway-api-key\0" + key.encode()).hexdigest()[:32]


def key_session_id(key: str) -> str:
    """The id of the session an API key names when a call names no session otherwise: the name in a
    ``session_key``, else a hash of the key (a credential never becomes a session id)."""
    named = secret_key_session_id(key)  # a rollout's secret per-session key: its name, after the secret
    if named is not None:
        return named
    if key.startswith(SESSION_KEY_PREFIX) and len(key) > len(SESSION_KEY_PREFIX):
        return key[len(SESSION_KEY_PREFIX):]
    return "key-" + key_hash(key)


def check_records_dir(records_dir: str | Path | None, resume: bool) -> None:
    """Refuse to append to a directory that already holds sessions unless asked to resume them."""
    if records_dir is None or resume:
        return
    path = Path(records_dir)
    n = sum(1 for _ in path.glob("*.jsonl")) if path.is_dir() else 0
    if n:
        raise GatewayError(
            f"records directory {path} already holds {n} session(s) from an earlier gateway; pass "
            "--resume-records (gateway.resume_records: true) to continue them, or pick another --records-dir")


@dataclass
class _Session:
    records: list[CallRecord] = field(default_factory=list)
    by_reuse_key: dict[bytes, CallRecord] = field(default_factory=dict)
    next_index: int = 0
    path: Path | None = None  # its JSONL file (computed once: a Path join costs more than the rest of _add)


# Set while a request's response is being produced (``SessionStore.responding``): a record deferred in that
# request waits for the response to go out instead of being built on the next loop turn, which at one call at
# a time comes before the response is sent. A one-element list, so a task that outlives its request (it
# copied the context) sees the request end.
_RESPONDING: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar("polar_gateway_responding", default=None)


_NO_OWNER = None  # a session whose first call carried no API key


class SessionStore:
    """Thread-safe: the server loop writes, admin/in-process readers may read from other threads."""

    def __init__(self, records_dir: str | Path | None, fsync: bool = False, max_sessions_in_memory: int = 4096,
                 resume: bool = False) -> None:
        check_records_dir(records_dir, resume)
        self.dir = Path(records_dir) if records_dir is not None else None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self._owners: dict[str, str | None] = {}  # every session id claimed or seen -> its owner's key hash
        self._with_records: set[str] = set()  # ids of the sessions that have records (listed by session_ids)
        self.fsync = fsync
        self.max_sessions_in_memory = max_sessions_in_memory
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.RLock()
        self._deferred: list[Callable[[], CallRecord]] = []
        self._pending: dict[Path, list[bytes]] = {}
        self._flush_scheduled = False
        self._files: OrderedDict[Path, Any] = OrderedDict()  # open append handles, least recently used first
        self.write_error: str | None = None  # why the last write failed (records kept in memory and retried)
        self.max_open_files = 128
        if self.dir is not None and resume:
            self._index_dir()

    def _index_dir(self) -> None:
        """Ids and owners of the sessions on disk, from each file's first record (one line per file)."""
        assert self.dir is not None  # only called with a records directory
        for path in sorted(self.dir.glob("*.jsonl")):
            try:
                with path.open("rb") as f:
                    first = orjson.loads(f.readline())
                self._owners.setdefault(first["session_id"], first.get("metadata", {}).get("owner"))
                self._with_records.add(first["session_id"])
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                log.warning("%s: cannot read its first record; its session is not listed until it is used", path)

    def _get(self, session_id: str) -> _Session:
        s = self._sessions.get(session_id)
        if s is None:
            s = _Session()
            for rec in self._load(session_id):
                self._index(s, rec)
            if s.records:
                self._owners.setdefault(session_id, s.records[0].metadata.get("owner"))
                self._with_records.add(session_id)
            self._sessions[session_id] = s
            # least recently used sessions leave memory; their files stay and reload on the next access
            while self.dir is not None and len(self._sessions) > self.max_sessions_in_memory:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session_id)
        return s

    def _load(self, session_id: str) -> list[CallRecord]:
        if self.dir is None:
            return []
        path = self.dir / f"{file_id(session_id)}.jsonl"
        lines: list[bytes] = []
        if path.exists():
            with path.open("rb") as f:
                lines = f.readlines()
        lines += self._pending.get(path, [])  # an evicted session's last records may not be on disk yet
        out = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                d = orjson.loads(line)
            except orjson.JSONDecodeError:
                log.warning("%s:%d is not valid JSON (a torn last write?); skipped", path, n)
                continue
            rec = CallRecord.from_dict(d)
            if rec.session_id == session_id:  # a hash collision can never mix sessions
                out.append(rec)
        return out

    @staticmethod
    def _index(s: _Session, rec: CallRecord) -> None:
        s.records.append(rec)
        key = rec.metadata.get("reuse_key")
        if key and rec.complete:
            s.by_reuse_key[bytes.fromhex(key)] = rec
        s.next_index = max(s.next_index, rec.call_index + 1)

    def next_call_index(self, session_id: str) -> int:
        with self._lock:
            self._run_deferred()
            s = self._get(session_id)
            i = s.next_index
            s.next_index += 1
            return i

    def claim(self, session_id: str, owner: str | None) -> str | None:
        """The session's owner: ``owner`` when this call creates the session, else whoever created it."""
        with self._lock:
            self._run_deferred()
            if session_id not in self._owners:
                self._get(session_id)  # a session on disk knows its owner from its records
                self._owners.setdefault(session_id, owner)
            return self._owners[session_id]

    def owner(self, session_id: str) -> str | None:
        """The owner's key hash of an existing session (``None``: created without a key, or unknown)."""
        with self._lock:
            self._run_deferred()
            if session_id not in self._owners and self._exists(session_id):
                self._get(session_id)
            return self._owners.get(session_id)

    def lookup(self, session_id: str, key: bytes) -> CallRecord | None:
        with self._lock:
            self._run_deferred()
            return self._get(session_id).by_reuse_key.get(key)

    def append(self, rec: CallRecord) -> None:
        """Index ``rec`` now; write it now (``fsync``, or no event loop) or on the loop's next turn."""
        with self._lock:
            self._add(rec)
            self._schedule()

    def defer(self, build: Callable[[], CallRecord]) -> None:
        """Build and append a record later: once the response of the request under way went out (inside
        ``responding``), else on the loop's next turn, or as soon as anything reads or indexes the store,
        whichever comes first. So the session's next call always sees it."""
        with self._lock:
            self._deferred.append(build)
            responding = _RESPONDING.get()
            if responding is None or not responding[0] or self.fsync:
                self._schedule()

    @contextlib.contextmanager
    def responding(self) -> Iterator[None]:
        """Around one request's whole response: records its call defers are built and written when the
        block ends (the response was sent, or the request failed), not before the response goes out.

        A reader meanwhile (another session's call, ``GET /sessions``) may already have built them: they
        then wait in ``_pending``, which no loop turn was scheduled to write, so the block's end writes
        those too."""
        marker = [True]
        token = _RESPONDING.set(marker)
        try:
            yield
        finally:
            marker[0] = False
            _RESPONDING.reset(token)
            if self._deferred or self._pending:
                self.flush()

    def _add(self, rec: CallRecord) -> None:
        s = self._get(rec.session_id)
        owner = self._owners.setdefault(rec.session_id, _NO_OWNER)
        self._with_records.add(rec.session_id)
        if owner is not None:
            rec.metadata["owner"] = owner
        rec, line = _serializable(rec)  # what is indexed is what is written: the session stays readable
        self._index(s, rec)
        if self.dir is not None:
            if s.path is None:
                s.path = self.dir / f"{file_id(rec.session_id)}.jsonl"
            self._pending.setdefault(s.path, []).append(line)

    def _run_deferred(self) -> None:
        builds, self._deferred = self._deferred, []
        for build in builds:
            try:
                self._add(build())
            except Exception:  # a bug building one record must not lose the others or break the caller
                log.exception("could not build a call record")

    def _schedule(self) -> None:
        if self._flush_scheduled:
            return
        try:
            loop = None if self.fsync else asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self.flush()
        else:
            self._flush_scheduled = True
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Build deferred records and write every pending one to its session file (append-only)."""
        with self._lock:
            self._flush_scheduled = False
            self._run_deferred()
            pending, self._pending = self._pending, {}
            error = None
            for path, lines in pending.items():
                try:
                    self._write(path, lines)
                except OSError as e:  # full disk, quota, I/O error: keep the lines and write them later
                    self._pending[path] = lines + self._pending.get(path, [])
                    error = f"cannot write call records to {path}: {e.strerror or e}"
            if error is not None and error != self.write_error:
                log.error("%s; %d session file(s) kept in memory until a write succeeds; new calls get 503",
                          error, len(self._pending))
            elif error is None and self.write_error is not None:
                log.warning("call records are written again (%s before)", self.write_error)
            self.write_error = error

    def writable(self) -> str | None:
        """``None`` when every record is on disk (after retrying any kept in memory), else why not."""
        with self._lock:
            if self.write_error is not None:
                self.flush()
            return self.write_error

    def _write(self, path: Path, lines: list[bytes]) -> None:
        """Append ``lines`` whole or not at all: a failed write is cut back, so no torn line is left for
        the next record to be glued onto."""
        f = self._files.pop(path, None)
        if f is None:
            f = open(path, "ab", buffering=0)
        start = -1
        try:
            start = os.fstat(f.fileno()).st_size  # a failure cuts back to here, whatever a failed write left
            data = memoryview(b"".join(lines))
            while data:
                n = f.write(data)  # an unbuffered write may be short (a nearly full disk)
                if not n:
                    raise OSError(errno.ENOSPC, "the file system accepted no more bytes")
                data = data[n:]
            if self.fsync:
                os.fsync(f.fileno())
        except BaseException:
            if start >= 0:
                with contextlib.suppress(OSError):
                    os.ftruncate(f.fileno(), start)
            f.close()
            raise
        self._files[path] = f
        while len(self._files) > self.max_open_files:
            self._files.popitem(last=False)[1].close()

    def close(self) -> None:
        """Write what is pending and close the open files (the store stays usable; files reopen on demand)."""
        with self._lock:
            self.flush()
            while self._files:
                self._files.popitem()[1].close()

    def records(self, session_id: str) -> list[CallRecord]:
        with self._lock:
            self._run_deferred()
            if session_id not in self._sessions and not self._exists(session_id):
                return []
            return sorted(self._get(session_id).records, key=lambda r: r.call_index)

    def has_records(self, session_id: str) -> bool:
        with self._lock:
            self._run_deferred()
            s = self._sessions.get(session_id)
            return bool(s.records) if s is not None else self._exists(session_id)

    def _exists(self, session_id: str) -> bool:
        if self.dir is None:
            return False
        path = self.dir / f"{file_id(session_id)}.jsonl"
        return path in self._pending or path.exists()

    def session_ids(self, owner: str | None = None, everyone: bool = True) -> list[str]:
        """Sessions with records; with ``everyone=False``, only those ``owner`` owns."""
        with self._lock:
            self.flush()
            ids = self._with_records
            if not everyone:
                return sorted(i for i in ids if owner is not None and self._owners.get(i) == owner)
            return sorted(ids)


def _serializable(rec: CallRecord) -> tuple[CallRecord, bytes]:
    """``rec`` and its JSONL line. The request models bound integers and nesting, so this always holds;
    should a field still not serialize (an integer beyond 64 bits, nesting beyond orjson's 255 levels),
    the record keeps its token data, its client fields as parsed back from Python's JSON, and says
    ``complete: false``, instead of being lost and breaking its session."""
    try:
        return rec, orjson.dumps(rec) + b"\n"
    except TypeError as e:
        why = f"the record could not be serialized as sent ({e}); its client fields were rewritten"
        log.error("session %r call %d: %s", rec.session_id, rec.call_index, why)
    d = dataclasses.asdict(rec)
    try:
        d = orjson.loads(json.dumps(d, default=repr))  # big integers become floats
        orjson.dumps(d)
    except (TypeError, ValueError, RecursionError):
        d.update(messages=[], tools=[], metadata={"owner": rec.metadata.get("owner")} if rec.metadata.get("owner") else {})
    d.update(complete=False, error=why)
    safe = CallRecord.from_dict(d)
    return safe, orjson.dumps(safe) + b"\n"
