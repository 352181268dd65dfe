"""Structured logs: every process of a run appends JSON lines to ``run_dir/logs/<role>-<pid>.jsonl``.

Each line carries ``role``, ``pid``, ``node`` (host name) and ``run_id``, plus the ``trace_id`` of the
fragment or session being worked on when the line was logged (:func:`trace` sets it for a block), so the
lines of one slow connector copy or one slow replica can be found across processes. The format is in
docs/evaluation.md; :func:`read_logs` reads them back, skipping torn lines.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar("polar_trace_id", default=None)


@contextlib.contextmanager
def trace(trace_id: str | None) -> Iterator[str | None]:
    """Lines logged inside the block (this thread / task) carry ``trace_id``."""
    token = _trace.set(trace_id)
    try:
        yield trace_id
    finally:
        _trace.reset(token)


class JsonLinesHandler(logging.Handler):
    """Writes one JSON object per record; line-buffered, so a crash loses at most the line being written."""

    def __init__(self, path: str | Path, role: str, run_id: str | None) -> None:
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1, encoding="utf-8")
        self.fields = {"role": role, "pid": os.getpid(), "node": socket.gethostname(), "run_id": run_id}

    def emit(self, record: logging.LogRecord) -> None:
        if self._f.closed:  # a thread that picked this handler up just before the run removed it
            return
        try:
            row: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname, "logger": record.name,
                                   "msg": record.getMessage(), **self.fields,
                                   "trace_id": getattr(record, "trace_id", None) or _trace.get()}
            if record.exc_info:
                row["exc"] = logging.Formatter().formatException(record.exc_info)
            self._f.write(json.dumps(row, default=str) + "\n")
        except Exception:  # a full disk must not take the run down through its logging
            self.handleError(record)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._f.close()
        super().close()


def install_run_logging(run_dir: str | Path, role: str, run_id: str | None = None, level: int | None = None,
                        logger: str = "polar") -> JsonLinesHandler:
    """Attach a handler writing ``run_dir/logs/<role>-<pid>.jsonl`` to the ``logger`` tree (default ``polar``).

    ``run_id`` defaults to the run directory's name; ``level`` to ``POLAR_LOG_LEVEL`` (e.g. ``DEBUG``: one
    line per fragment, with its trace id), else INFO. Returns the handler; ``remove_run_logging`` detaches it.
    """
    if level is None:
        name = os.environ.get("POLAR_LOG_LEVEL", "INFO").upper()
        level = logging.getLevelName(name) if isinstance(logging.getLevelName(name), int) else logging.INFO
    run_dir = Path(run_dir)
    handler = JsonLinesHandler(run_dir / "logs" / f"{role}-{os.getpid()}.jsonl", role, run_id or run_dir.name)
    handler.setLevel(level)
    target = logging.getLogger(logger)
    target.addHandler(handler)
    if target.getEffectiveLevel() > level:
        target.setLevel(level)
    return handler


def remove_run_logging(handler: logging.Handler, logger: str = "polar") -> None:
    logging.getLogger(logger).removeHandler(handler)
    handler.close()


def read_logs(run_dir: str | Path, query: str | None = None, role: str | None = None, trace_id: str | None = None,
              since_ts: float | None = None, limit: int = 1000) -> list[dict[str, Any]]:
    """The run's log lines, oldest first: those whose message contains ``query`` (case-insensitive), of
    ``role``, of ``trace_id``, at or after ``since_ts``; at most the last ``limit``. Torn lines are skipped."""
    rows: list[dict[str, Any]] = []
    q = query.lower() if query else None
    for path in sorted((Path(run_dir) / "logs").glob("*.jsonl")):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(row, dict):
                continue
            if role and row.get("role") != role:
                continue
            if trace_id and row.get("trace_id") != trace_id:
                continue
            if since_ts is not None and float(row.get("ts") or 0) < since_ts:
                continue
            if q and q not in str(row.get("msg", "")).lower():
                continue
            rows.append(row)
    rows.sort(key=lambda r: float(r.get("ts") or 0))
    return rows[-limit:] if limit else rows

