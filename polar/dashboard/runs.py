"""What the dashboard reads from a runs folder: runs, their curves, sessions, episodes, reports, logs.

Everything here reads files only, and only inside the runs folder (:func:`safe_path`). A file that is
missing, half-written or corrupt yields what can be read plus a note of what was skipped, never an error.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from polar.dashboard.metrics_index import MetricsIndex
from polar.trainers.run_dir import run_status

log = logging.getLogger(__name__)

MAX_RUN_DEPTH = 3  # run folders are looked for this deep under the runs folder
INDEX_CHUNK_BYTES = 16 << 20  # how much of the index file one step of the line index reads
PAGED_INDEX_BYTES = 4 << 20  # a bigger sessions/index.jsonl is paged without parsing every row (``JsonlTail.page``)
MAX_TOKENS_SHOWN = 20_000  # per sample: a huge session shows its first tokens and says how many it left out
MAX_CALLS_SHOWN = 200
MAX_TEXT = 4_000  # characters of one message or output shown


class PathError(ValueError):
    """A requested path that is not inside the runs folder (or does not exist)."""


def safe_path(root: Path, rel: str) -> Path:
    """``root/rel`` when it stays inside ``root`` after resolving ``..`` and symlinks; else ``PathError``."""
    if "\x00" in rel:
        raise PathError("bad path")
    base = root.resolve()
    p = (base / rel).resolve()
    if p != base and not p.is_relative_to(base):
        raise PathError(f"{rel!r} is outside the runs folder")
    return p


def within(root: Path, p: Path) -> bool:
    """``p`` resolves (symlinks followed) to a place inside ``root``, which is resolved already."""
    try:
        return p.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a symlink loop
        return False


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, ValueError) as e:
        return None, f"{path.name} is unreadable: {e}"


def _clip(text: Any, n: int = MAX_TEXT) -> Any:
    if isinstance(text, str) and len(text) > n:
        return text[:n] + f"... [{len(text) - n} more characters not shown]"
    return text


class JsonlTail:
    """Rows of an append-only JSONL file, read incrementally up to its last complete line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rows: list[dict[str, Any]] = []
        self.skipped = 0
        self.lock = threading.Lock()
        self.starts: np.ndarray = np.zeros(0, np.int64)  # byte offset of each non-blank complete line, for ``page``
        self.indexed = 0  # bytes of the file ``starts`` covers
        self.page_lock = threading.Lock()  # not ``lock``: a page never waits for a full parse under way

    def page(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Rows ``offset``..``offset+limit`` and the number of lines, parsing only that page: a store of
        100,000 sessions shows its first page without reading every row. (Until every row was parsed, the
        count includes lines that turn out corrupt; those are left out of the page.)"""
        with self.page_lock:
            try:
                size = os.path.getsize(self.path)
            except OSError:
                return [], 0
            if size < self.indexed:
                self.starts, self.indexed = np.zeros(0, np.int64), 0
            if self.offset == size:  # every row is parsed already (``update``): page from them
                rows = self.rows
                return rows[offset:offset + limit], len(rows)
            with open(self.path, "rb") as f:
                if size > self.indexed:  # index what was appended, a chunk at a time (bounded memory)
                    f.seek(self.indexed)
                    parts, base, pending = [self.starts], self.indexed, b""
                    while chunk := f.read(INDEX_CHUNK_BYTES):
                        data = pending + chunk
                        end = data.rfind(b"\n")
                        if end < 0:  # a line longer than a chunk so far
                            pending = data
                            continue
                        parts.append(base + _line_starts(data[:end + 1]))
                        base, pending = base + end + 1, data[end + 1:]
                    self.starts, self.indexed = np.concatenate(parts), base
                chosen = self.starts[offset:offset + limit] if offset >= 0 else self.starts[:0]
                if not len(chosen):
                    return [], len(self.starts)
                stop = int(self.starts[offset + limit]) if offset + limit < len(self.starts) else self.indexed
                f.seek(int(chosen[0]))
                data = f.read(stop - int(chosen[0]))
        rows = []
        for line in data.splitlines():
            try:
                row = json.loads(line) if line.strip() else None
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows, len(self.starts)

    def update(self) -> list[dict[str, Any]]:
        with self.lock:
            try:
                size = os.path.getsize(self.path)
            except OSError:
                return self.rows
            if size < self.offset:
                self.offset, self.rows, self.skipped = 0, [], 0
            if size > self.offset:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read(size - self.offset)
                end = data.rfind(b"\n")
                if end >= 0:
                    self.offset += end + 1
                    for line in data[: end + 1].splitlines():
                        if not line.strip():
                            continue
                        try:
                            row = json.loads(line)
                        except ValueError:
                            self.skipped += 1
                            continue
                        if isinstance(row, dict):
                            self.rows.append(row)
                        else:
                            self.skipped += 1
            return self.rows


def _line_starts(data: bytes) -> np.ndarray:
    """Offsets of the non-blank complete lines of ``data`` (vectorized: 100,000 lines in milliseconds)."""
    buf = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(buf == 10)
    starts = np.concatenate([np.zeros(1, np.int64), ends[:-1] + 1]) if len(ends) else np.zeros(0, np.int64)
    maybe_blank = np.flatnonzero(np.isin(buf[np.minimum(starts, len(buf) - 1)], (9, 10, 13, 32)) if len(starts) else [])
    keep: np.ndarray = np.ones(len(starts), bool)
    for i in maybe_blank:  # lines that begin with whitespace: rare, checked one by one
        keep[i] = bool(data[starts[i]:ends[i]].strip())
    return starts[keep].astype(np.int64)


class Run:
    """One run directory, as the dashboard sees it."""

    def __init__(self, root: Path, path: Path) -> None:
        self.root = root
        self.path = path
        self.id = path.relative_to(root).as_posix() if path != root else "."
        self.metrics = MetricsIndex(self.inside("metrics.jsonl"))
        self.sessions = JsonlTail(self.inside("sessions/index.jsonl"))
        self.scale_events = JsonlTail(self.inside("scale_events.jsonl"))
        self.ratings = JsonlTail(self.inside("ratings.jsonl"))

    def inside(self, rel: str) -> Path:
        """``path/rel`` when it resolves inside the runs folder; else a path that does not exist, so a file a
        run links to from outside (``metrics.jsonl -> /etc/passwd``) reads as absent, never as data."""
        p = self.path / rel
        return p if within(self.root.resolve(), p) else self.root / ".polar-outside-the-runs-folder" / rel

    def info(self) -> dict[str, Any]:
        meta, problem = _read_json(self.inside("run.json"))
        meta = meta if isinstance(meta, dict) else {}
        try:
            st = run_status(self.path)
        except Exception as e:  # a run.json torn mid-write reads as unknown, never as an error page
            st = {"status": "unknown", "error": str(e)}
        m = self.metrics
        return {"id": self.id, "name": meta.get("name", self.path.name), "kind": meta.get("kind"),
                "created": meta.get("created"), "status": st.get("status"), "error": st.get("error"),
                "pid": st.get("pid"), "host": st.get("host"), "problem": problem,
                "rows": m.rows, "skipped_rows": m.skipped, "indexed_bytes": m.offset,
                "metrics_bytes": _size(self.inside("metrics.jsonl")),
                "has_sessions": self.inside("sessions/index.jsonl").is_file()
                or self.inside("gateway/sessions").is_dir(),
                "has_episodes": self.inside("episodes").is_dir()}

    # ------------------------------------------------------------------ sessions
    def session_rows(self) -> tuple[list[dict[str, Any]], str | None]:
        """Session summaries: ``sessions/index.jsonl``; else (older agent runs) one per call-record file."""
        rows = self.sessions.update()
        if rows:
            note = f"{self.sessions.skipped} corrupt lines of sessions/index.jsonl skipped" if self.sessions.skipped else None
            return rows, note
        rec = self.inside("gateway/sessions")
        if rec.is_dir():
            out = [{"session_id": p.stem, "status": "unknown", "records": "gateway/sessions", "reward": None}
                   for p in sorted(rec.glob("*.jsonl")) if within(self.root.resolve(), p)]
            return out, "no sessions/index.jsonl: sessions listed from their gateway call records (no rewards)"
        return [], None

    def sessions_paged(self) -> bool:
        """Whether the sessions table pages ``sessions/index.jsonl`` without parsing every row (a big store)."""
        return _size(self.inside("sessions/index.jsonl")) > PAGED_INDEX_BYTES

    def session_page(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], int, str | None]:
        """One page of session summaries, the total, and a note; only the page's rows are parsed."""
        if self.sessions_paged():  # big: index the lines, parse one page
            rows, total = self.sessions.page(offset, limit)
            if total:
                return rows, total, None
        rows, note = self.session_rows()  # small: parse every row (the total leaves corrupt lines out)
        return rows[offset:offset + limit], len(rows), note

    def session(self, sid: str) -> dict[str, Any]:
        rows, _ = self.session_rows()
        summary = next((r for r in reversed(rows) if r.get("session_id") == sid), None)
        if summary is None:
            raise KeyError(sid)
        notes: list[str] = []
        samples = self._samples(summary, notes)
        calls = self._calls(summary, notes)
        if not samples and calls:  # no stored trajectory: each call's prompt then its sampled tokens
            samples = [_sample_from_call(c) for c in calls]
            notes.append("no stored trajectory: the trace is rebuilt from the call records, one chain per call")
        for c in calls:
            c.pop("prompt_ids", None)
            c.pop("sampled_ids", None)
            c.pop("logprobs", None)
        out = {k: _clip(v) for k, v in summary.items()}
        out["verifier_output"] = summary.get("verifier_output")
        out.update(samples=samples, calls=calls, notes=notes)
        return out

    def _samples(self, summary: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
        rel = summary.get("trajectory")
        if not rel:
            return []
        try:
            p = safe_path(self.path / "sessions", rel)
            table = pq.read_table(p, filters=[("session_id", "==", summary["session_id"])])
        except Exception as e:
            notes.append(f"trajectory {rel} unreadable: {e}")
            return []
        out = []
        for r in table.to_pylist():
            n = len(r["token_ids"])
            keep = min(n, MAX_TOKENS_SHOWN)
            if n > keep:
                notes.append(f"sample of {n} tokens: the first {keep} are shown, {n - keep} are not")
            meta = json.loads(r["metadata"]) if r.get("metadata") else {}
            out.append({"token_ids": r["token_ids"][:keep], "loss_mask": r["loss_mask"][:keep],
                        "logprobs": r["logprobs"][:keep], "policy_versions": r["policy_versions"][:keep],
                        "call_indices": r["call_indices"][:keep], "token_text": (r.get("token_text") or [])[:keep],
                        "reward": r["reward"], "tokens_total": n, "calls": meta.get("calls")})
        return out

    def _calls(self, summary: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
        from polar.gateway.sessions import file_id

        rel = summary.get("records")
        if not rel:
            return []
        try:
            p = safe_path(self.path, f"{rel}/{file_id(summary['session_id'])}.jsonl")
        except PathError as e:
            notes.append(str(e))
            return []
        if not p.is_file():
            notes.append(f"no call records at {rel}")
            return []
        calls: list[dict[str, Any]] = []
        skipped = 0
        with open(p, "rb") as f:
            for line in f:
                if len(calls) >= MAX_CALLS_SHOWN:
                    notes.append(f"more than {MAX_CALLS_SHOWN} calls: the rest are not shown")
                    break
                try:
                    c = json.loads(line)
                except ValueError:
                    skipped += 1
                    continue
                md = c.get("metadata") or {}
                calls.append({"call_index": c.get("call_index"), "policy_version": c.get("policy_version"),
                              "finish_reason": c.get("finish_reason"), "complete": c.get("complete"),
                              "error": c.get("error"), "started_at": c.get("started_at"),
                              "ended_at": c.get("ended_at"), "timings": md.get("timings"),
                              "prompt_tokens": len(c.get("prompt_ids") or []),
                              "sampled_tokens": len(c.get("sampled_ids") or []),
                              "prompt_ids": c.get("prompt_ids") or [], "sampled_ids": c.get("sampled_ids") or [],
                              "logprobs": c.get("logprobs") or [],
                              "output": _clip(json.dumps((md.get("output") or {}).get("content"))),
                              "messages": [{"role": m.get("role"), "content": _clip(m.get("content"))}
                                           for m in (c.get("messages") or [])[-20:] if isinstance(m, dict)]})
        if skipped:
            notes.append(f"{skipped} corrupt call-record lines skipped")
        return calls

    # ------------------------------------------------------------------ episodes
    def recordings(self) -> list[dict[str, Any]]:
        out = []
        for idx in sorted(self.inside("episodes").glob("*/index.json")):
            if not within(self.root.resolve(), idx):
                continue
            data, problem = _read_json(idx)
            if not isinstance(data, dict):
                out.append({"tag": idx.parent.name, "problem": problem or "index.json is not an object", "episodes": []})
                continue
            data["tag"] = idx.parent.name
            data.pop("harness", None)
            out.append(data)
        return out

    def episode(self, tag: str, ep: str) -> dict[str, Any]:
        p = safe_path(self.path / "episodes", f"{tag}/{ep}/steps.jsonl")
        if not p.is_file():
            raise KeyError(f"{tag}/{ep}")
        tail = JsonlTail(p)
        steps = tail.update()
        base = p.parent.relative_to(self.root.resolve()).as_posix()
        for s in steps:
            if s.get("frame"):
                s["frame_url"] = f"/files/{base}/{s['frame']}"
        notes = [f"{tail.skipped} corrupt step lines skipped"] if tail.skipped else []
        return {"tag": tag, "id": ep, "steps": steps, "notes": notes}

    def target_info(self, kind: str, target: str) -> dict[str, Any]:
        """What a rating of ``target`` is about: its task id, verifier reward (an episode's return), and the
        prompt and response a preference dataset holds. ``KeyError`` for an unknown target."""
        if kind == "session":
            rows, _ = self.session_rows()
            s = next((r for r in reversed(rows) if r.get("session_id") == target), None)
            if s is None:
                raise KeyError(target)
            prompt = None
            calls = self._calls(s, [])
            if calls:
                prompt = json.dumps(calls[0]["messages"])
            return {"task_id": s.get("task_id") or target, "reward": s.get("reward"), "prompt": prompt,
                    "response": s.get("output")}
        tag, _, ep = target.partition("/")
        for rec in self.recordings():
            if rec.get("tag") != tag:
                continue
            for e in rec.get("episodes", []):
                if e.get("id") == ep:
                    data, _ = _read_json(self.inside(f"episodes/{tag}/index.json"))
                    h = (data or {}).get("harness") or {}
                    env = h.get("id") or (h.get("connector_spec") or {}).get("class_name") or h.get("type")
                    steps = self.episode(tag, ep)["steps"]
                    return {"task_id": f"{env}:seed={e.get('seed')}", "reward": e.get("return"),
                            "prompt": f"{env} reset(seed={e.get('seed')})",
                            "response": json.dumps([s.get("action") for s in steps[1:]])}
        raise KeyError(target)

    # ------------------------------------------------------------------ events, logs
    def events(self) -> dict[str, Any]:
        counters: dict[str, list[dict[str, float]]] = {}
        for key in ("connector/process_restarts", "connector/copies_restarted", "rollout/restarts",
                    "rollout/scale_events", "rollout/dropped_fragments", "nonfinite_skipped_fragments"):
            s = self.metrics.series.get(key)
            if s is None or s.n == 0:
                continue
            x, y = s.x[: s.n], s.y[: s.n]
            jumps: np.ndarray = np.flatnonzero(np.diff(y) > 0) + 1
            first = [0] if y[0] > 0 else []
            idx = np.concatenate([np.asarray(first, dtype=np.int64), jumps])[-1000:]
            counters[key] = [{"x": float(x[i]), "value": float(y[i]),
                              "delta": float(y[i] - (y[i - 1] if i else 0))} for i in idx]
        return {"counters": counters, "scale_events": self.scale_events.update()[-1000:],
                "skipped": self.scale_events.skipped}

    def logs(self, query: str = "", limit: int = 500) -> dict[str, Any]:
        rows: list[dict[str, Any]] = []
        files = [f for f in sorted(self.inside("logs").glob("*.jsonl")) if within(self.root.resolve(), f)]
        q = query.lower()
        for f in files:
            try:
                with open(f, "rb") as fh:
                    fh.seek(max(0, _size(f) - (4 << 20)))  # the last 4 MiB of each file
                    lines = fh.read().splitlines()
            except OSError:
                continue
            for line in lines:
                if q and q not in line.decode(errors="replace").lower():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    row.setdefault("file", f.name)
                    rows.append(row)
        def when(r: dict[str, Any]) -> float:
            t = r.get("ts", r.get("time"))
            return float(t) if isinstance(t, (int, float)) else 0.0
        rows.sort(key=when)
        return {"files": [f.name for f in files], "rows": rows[-limit:]}


def _sample_from_call(c: dict[str, Any]) -> dict[str, Any]:
    p, s = c["prompt_ids"], c["sampled_ids"]
    lp = list(c["logprobs"]) + [0.0] * (len(s) - len(c["logprobs"]))
    ids = (p + s)[:MAX_TOKENS_SHOWN]
    n = len(ids)
    return {"token_ids": ids, "loss_mask": ([0] * len(p) + [1] * len(s))[:n], "logprobs": ([0.0] * len(p) + lp)[:n],
            "policy_versions": [c.get("policy_version")] * n, "call_indices": [c.get("call_index")] * n,
            "token_text": [], "reward": None, "tokens_total": len(p) + len(s)}


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


class RunsFolder:
    """The runs under one folder, found afresh at most every ``rescan_s``."""

    def __init__(self, root: str | Path, rescan_s: float = 2.0) -> None:
        self.root = Path(root).resolve()
        self.rescan_s = rescan_s
        self._runs: dict[str, Run] = {}
        self._scanned = 0.0
        self._lock = threading.Lock()
        self._reports: list[dict[str, Any]] = []
        self._reports_scanned = 0.0

    def runs(self) -> dict[str, Run]:
        with self._lock:
            if time.monotonic() - self._scanned > self.rescan_s:
                self._scan()
            return dict(self._runs)

    def get(self, run_id: str) -> Run:
        runs = self.runs()
        if run_id not in runs:
            with self._lock:
                self._scan()  # a run created since the last scan
            runs = self._runs
        if run_id not in runs:
            raise KeyError(run_id)
        return runs[run_id]

    def _scan(self) -> None:
        found: dict[str, Run] = {}
        if (self.root / "run.json").is_file():
            found["."] = self._runs.get(".") or Run(self.root, self.root)
        else:
            frontier = [self.root]
            for _ in range(MAX_RUN_DEPTH):
                nxt = []
                for d in frontier:
                    try:
                        children = sorted(c for c in d.iterdir() if c.is_dir() and not c.name.startswith("."))
                    except OSError:
                        continue
                    for c in children:
                        if not within(self.root, c):  # a symlinked folder pointing out of the runs folder
                            continue
                        if (c / "run.json").is_file():
                            rid = c.relative_to(self.root).as_posix()
                            found[rid] = self._runs.get(rid) or Run(self.root, c)
                        elif c.name not in ("checkpoints", "tb", "sessions", "episodes", "workspaces"):
                            nxt.append(c)
                frontier = nxt
        self._runs = found
        self._scanned = time.monotonic()

    def reports(self) -> list[dict[str, Any]]:
        """Every ``report.json`` under the folder (evaluation suites), newest first."""
        if time.monotonic() - self._reports_scanned < self.rescan_s:
            return self._reports
        out: list[dict[str, Any]] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            depth = Path(dirpath).relative_to(self.root).parts
            dirnames[:] = [d for d in dirnames if d not in ("checkpoints", "tb", "workspaces", "trajectories")
                           and not d.startswith(".") and not (len(depth) >= 2 and d.startswith("ep_"))]
            if len(depth) >= 5:
                dirnames[:] = []
            if "report.json" in filenames:
                p = Path(dirpath) / "report.json"
                rel = p.parent.relative_to(self.root).as_posix()
                out.append({"id": rel, "mtime": p.stat().st_mtime,
                            "html": "report.html" in filenames, "md": "report.md" in filenames})
        out.sort(key=lambda r: -r["mtime"])
        self._reports, self._reports_scanned = out, time.monotonic()
        return out
