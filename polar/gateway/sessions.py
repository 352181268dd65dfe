"""Per-session call records: append-only JSONL files in the run directory, plus an in-memory index.

Layout: ``<records_dir>/<file id>.jsonl``, one ``CallRecord`` per line. A record is built, indexed and
written on the next turn of the event loop after its call ends, once the response has gone out, so none
of that work is on the request's critical path. Anything that reads the store first (the session's next
call, ``GET /sessions/{id}``, ``records``) builds pending records before it reads, so no reader misses
one. A crash loses at most the calls of that one loop turn; with ``fsync=True`` every record is written
and fsynced before the call returns. The file id is the session id when it
is filename-safe, otherwise a hash of it (API keys used as session ids are never written as names).
A gateway restarted on the same directory reloads a session lazily, so call indices and token reuse
continue where they stopped.

Isolation: every lookup is keyed by the session id; the reuse index of one session never sees another
session's records.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.gateway import _json
from polar.types import CallRecord

log = logging.getLogger(__name__)

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def file_id(session_id: str) -> str:
    if _SAFE.match(session_id) and not session_id.startswith("sk-"):
        return session_id
    return "h-" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


@dataclass
class _Session:
    records: list[CallRecord] = field(default_factory=list)
    by_reuse_key: dict[bytes, CallRecord] = field(default_factory=dict)
    next_index: int = 0


class SessionStore:
    """Thread-safe: the server loop writes, admin/in-process readers may read from other threads."""

    def __init__(self, records_dir: str | Path | None, fsync: bool = False, max_sessions_in_memory: int = 4096) -> None:
        self.dir = Path(records_dir) if records_dir is not None else None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.max_sessions_in_memory = max_sessions_in_memory
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.RLock()
        self._deferred: list[Callable[[], CallRecord]] = []
        self._pending: dict[Path, list[bytes]] = {}
        self._flush_scheduled = False
        self._files: OrderedDict[Path, Any] = OrderedDict()  # open append handles, least recently used first
        self.max_open_files = 128

    def _get(self, session_id: str) -> _Session:
        s = self._sessions.get(session_id)
        if s is None:
            s = _Session()
            for rec in self._load(session_id):
                self._index(s, rec)
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
        if path in self._pending:  # an evicted session's last records may not be on disk yet
            self._write(path, self._pending.pop(path))
        if not path.exists():
            return []
        out = []
        with path.open("rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = _json.loads(line)
                except _json.JSONDecodeError:
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
        """Build and append a record later: on the loop's next turn (after the response went out), or as
        soon as anything reads or indexes the store, whichever comes first. So the session's next call
        always sees it."""
        with self._lock:
            self._deferred.append(build)
            self._schedule()

    def _add(self, rec: CallRecord) -> None:
        s = self._get(rec.session_id)
        self._index(s, rec)
        if self.dir is not None:
            path = self.dir / f"{file_id(rec.session_id)}.jsonl"
            self._pending.setdefault(path, []).append(_json.dumps_record(rec) + b"\n")

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
            for path, lines in pending.items():
                try:
                    self._write(path, lines)
                except OSError:
                    log.exception("could not persist %d record(s) to %s", len(lines), path)

    def _write(self, path: Path, lines: list[bytes]) -> None:
        f = self._files.pop(path, None)
        if f is None:
            f = open(path, "ab", buffering=0)
        try:
            f.write(b"".join(lines))
            if self.fsync:
                os.fsync(f.fileno())
        except BaseException:
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

    def _exists(self, session_id: str) -> bool:
        return self.dir is not None and (self.dir / f"{file_id(session_id)}.jsonl").exists()

    def session_ids(self) -> list[str]:
        """Sessions with records (in memory; on disk too when the ids are readable from the files)."""
        with self._lock:
            self.flush()
            ids = {k for k, s in self._sessions.items() if s.records}
            if self.dir is not None:
                ids |= {p.stem for p in self.dir.glob("*.jsonl") if not p.stem.startswith("h-")}
            return sorted(ids)
