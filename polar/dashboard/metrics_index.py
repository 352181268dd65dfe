"""An incremental, in-memory index of one run's ``metrics.jsonl``, and LTTB downsampling.

The file is read once, from the byte offset the index last stopped at, and only up to the last complete
line: a line still being written is read on the next poll, so a live run never shows half a row. Each
numeric key becomes a pair of growable float64 arrays (x, y), so a request for a curve downsamples in
memory and never re-reads the file. Corrupt lines are counted and skipped, never fatal.

x is the row's ``env_steps``, else ``step``, else ``iteration``, else ``sft_step``, else the row number.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import orjson

_fast_loads = orjson.loads


def _loads(line: bytes) -> Any:  # JSON: any value; callers check for a dict
    try:
        return _fast_loads(line)
    except ValueError:
        return json.loads(line)  # Python's json also reads NaN / Infinity, as json.dumps writes them

log = logging.getLogger(__name__)

X_KEYS = ("env_steps", "step", "iteration", "sft_step")
# the curves a page charts first, in this order (the page asks the server, so this is the one list)
DEFAULT_CHARTS = [re.compile(p) for p in (
    r"^(episode_reward_mean|reward_mean|return_mean)$", r"^(episode_len_mean|length_mean)$", r"loss",
    r"^(fps|rollout/env_steps_per_s|learner/samples_per_s)$", r"^(policy_lag|rollout/policy_lag_mean)$",
    r"^(learning_rate|lr)$", r"^(success_rate|eval_success|eval/success_rate)$")]
CHUNK_BYTES = 16 << 20  # read at most this much per pass, so one poll of a huge file stays bounded
FAST_MIN_ROWS = 256  # chunks of at least this many rows go through Arrow's JSON reader first


class _Series:
    """Growable (x, y) float64 arrays."""

    __slots__ = ("n", "x", "y")

    def __init__(self) -> None:
        self.n = 0
        self.x = np.empty(64)
        self.y = np.empty(64)

    def extend(self, xs: np.ndarray, ys: np.ndarray) -> None:
        need = self.n + len(xs)
        if need > len(self.x):
            cap = max(need, 2 * len(self.x))
            for name in ("x", "y"):
                grown = np.empty(cap)
                grown[: self.n] = getattr(self, name)[: self.n]
                setattr(self, name, grown)
        self.x[self.n:need] = xs
        self.y[self.n:need] = ys
        self.n = need


def lttb(x: np.ndarray, y: np.ndarray, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Largest-Triangle-Three-Buckets (Steinarsson 2013), vectorized: ``n_out`` points that keep a curve's shape.

    The first and last points stay; the points between are cut into ``n_out - 2`` buckets and each bucket
    keeps the point forming the largest triangle with the means of the buckets before and after it (the
    sequential original uses the point kept before instead of that bucket's mean). No Python loop: a few
    passes of numpy over the arrays, so a curve of 10^6 points downsamples in tens of milliseconds."""
    n = len(x)
    if n_out >= n or n_out < 3:
        return x, y
    m = n_out - 2
    edges = np.linspace(1, n - 1, m + 1).astype(np.int64)  # bucket i is [edges[i], edges[i + 1])
    counts = np.diff(edges)
    if np.any(counts == 0):  # fewer points between the ends than buckets: keep them all
        return x, y
    cx, cy = np.concatenate(([0.0], np.cumsum(x))), np.concatenate(([0.0], np.cumsum(y)))
    mx = (cx[edges[1:]] - cx[edges[:-1]]) / counts
    my = (cy[edges[1:]] - cy[edges[:-1]]) / counts
    ax, ay = np.concatenate(([x[0]], mx[:-1])), np.concatenate(([y[0]], my[:-1]))  # the bucket before
    bx, by = np.concatenate((mx[1:], [x[-1]])), np.concatenate((my[1:], [y[-1]]))  # the bucket after
    bucket: np.ndarray = np.repeat(np.arange(m), counts)
    xi, yi = x[1:n - 1], y[1:n - 1]
    area = np.abs((ax - bx)[bucket] * (yi - ay[bucket]) - (ax[bucket] - xi) * (by - ay)[bucket])
    best = np.maximum.reduceat(area, edges[:-1] - 1)
    hits = np.flatnonzero(area == best[bucket])
    _, first = np.unique(bucket[hits], return_index=True)  # the first point with the largest area, per bucket
    keep = np.concatenate(([0], hits[first] + 1, [n - 1]))
    return x[keep], y[keep]


class MetricsIndex:
    """The curves of one ``metrics.jsonl``; ``update()`` reads whatever was appended since the last call."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.rows = 0
        self.skipped = 0  # corrupt or non-object lines
        self.skipped_examples: list[str] = []
        self.series: dict[str, _Series] = {}
        self.last_row: dict[str, Any] = {}
        self.lock = threading.Lock()
        self._inode: int | None = None
        self._cache: dict[tuple[str, int], tuple[int, list[list[float]]]] = {}

    @property
    def keys(self) -> list[str]:
        return sorted(self.series)

    def update(self, max_bytes: int = CHUNK_BYTES) -> dict[str, list[list[float]]]:
        """Index the complete lines appended since the last call (at most ``max_bytes``); returns the new
        points per key. A file that shrank or was replaced (``polar resume`` cuts rows) is re-indexed."""
        try:
            st = os.stat(self.path)
        except OSError:
            return {}
        with self.lock:
            if st.st_size < self.offset or (self._inode is not None and st.st_ino != self._inode):
                self._reset()
            self._inode = st.st_ino
            if st.st_size == self.offset:
                return {}
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read(min(max_bytes, st.st_size - self.offset))
            except OSError as e:
                log.warning("cannot read %s: %s", self.path, e)
                return {}
            end = data.rfind(b"\n")
            if end < 0:
                if len(data) >= max_bytes:  # one line longer than a whole chunk: not a metrics row
                    self._skip(data[:80])
                    self.offset += len(data)
                return {}
            self.offset += end + 1
            chunk = data[: end + 1]
            if chunk.count(b"\n") >= FAST_MIN_ROWS:
                fast = self._absorb_columns(chunk)
                if fast is not None:
                    return fast
            return self._absorb(chunk.split(b"\n")[:-1])

    def update_all(self) -> None:
        """Index the whole file (in bounded chunks)."""
        while True:
            before = self.offset
            self.update()
            if self.offset == before:
                return

    def _reset(self) -> None:
        self.offset = self.rows = self.skipped = 0
        self.skipped_examples = []
        self.series = {}
        self._cache = {}

    def _skip(self, line: bytes) -> None:
        self.skipped += 1
        if len(self.skipped_examples) < 5:
            self.skipped_examples.append(f"row {self.rows + self.skipped}: {line[:80].decode(errors='replace')!r}")

    def _absorb_columns(self, chunk: bytes) -> dict[str, list[list[float]]] | None:
        """Many clean rows at once through Arrow's JSON reader (C++); None when the chunk holds anything it
        does not take (a corrupt line, NaN, a key that changes type), and the rows are read one by one."""
        import io

        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj

        try:
            table = pj.read_json(io.BytesIO(chunk), read_options=pj.ReadOptions(block_size=len(chunk) + 1))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            return None
        n = table.num_rows
        cols: dict[str, np.ndarray] = {}
        for name, col in zip(table.column_names, table.columns, strict=True):
            t = col.type
            if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
                cols[name] = pc.fill_null(pc.cast(col, pa.float64()), float("nan")).to_numpy()
        x = np.full(n, np.nan)
        for k in X_KEYS:
            if k in cols and not pa.types.is_boolean(table.schema.field(k).type):
                x = np.where(np.isnan(x), cols[k], x)
        rownum: np.ndarray = self.rows + np.arange(n, dtype=np.float64)
        x = np.where(np.isnan(x), rownum, x)
        out: dict[str, list[list[float]]] = {}
        for k, v in cols.items():
            keep = np.isfinite(v)
            if not keep.any():
                continue
            xs, ys = x[keep], v[keep]
            self.series.setdefault(k, _Series()).extend(xs, ys)
            out[k] = np.stack([xs[-500:], ys[-500:]], axis=1).tolist()
        self.rows += n
        last = chunk[: -1].rsplit(b"\n", 1)[-1]
        try:
            self.last_row = _loads(last)
        except ValueError:
            pass
        return out

    def _absorb(self, lines: list[bytes]) -> dict[str, list[list[float]]]:
        cols: dict[str, tuple[list[float], list[float]]] = {}
        for line in lines:
            if not line.strip():
                continue
            try:
                row = _loads(line)
            except ValueError:
                self._skip(line)
                continue
            if not isinstance(row, dict):
                self._skip(line)
                continue
            x = None
            for k in X_KEYS:
                v = row.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    x = float(v)
                    break
            if x is None:
                x = float(self.rows)
            self.rows += 1
            self.last_row = row
            for k, v in row.items():
                if isinstance(v, bool):
                    v = float(v)
                if isinstance(v, (int, float)) and math.isfinite(v):
                    xs, ys = cols.setdefault(k, ([], []))
                    xs.append(x)
                    ys.append(float(v))
        for k, (xs, ys) in cols.items():
            self.series.setdefault(k, _Series()).extend(np.asarray(xs), np.asarray(ys))
        return {k: [list(p) for p in zip(xs[-500:], ys[-500:], strict=True)] for k, (xs, ys) in cols.items()}

    def curve(self, key: str, n_out: int = 1000) -> list[list[float]]:
        """``key``'s curve as ``[[x, y], ...]``, LTTB-downsampled to at most ``n_out`` points (cached until
        the next rows arrive)."""
        with self.lock:  # a snapshot: rows below n never change, so the downsampling runs unlocked
            s = self.series.get(key)
            if s is None:
                return []
            hit = self._cache.get((key, n_out))
            if hit is not None and hit[0] == s.n:
                return hit[1]
            n, x, y = s.n, s.x[: s.n], s.y[: s.n]
        if n > 1 and np.any(np.diff(x) < 0):  # a resumed run may step back: draw in x order
            order = np.argsort(x, kind="stable")
            x, y = x[order], y[order]
        dx, dy = lttb(x, y, n_out)
        pts = np.stack([dx, dy], axis=1).tolist()
        self._cache[(key, n_out)] = (n, pts)
        return pts

    def default_charts(self, limit: int = 16) -> list[str]:
        keys = [k for k in self.keys if not k.startswith(("system/", "time/"))]
        out: list[str] = []
        for pat in DEFAULT_CHARTS:
            out += [k for k in keys if pat.search(k) and k not in out]
        return out[:limit]

    def warm_curves(self, n_out: int = 1000) -> None:
        """Downsample every curve once (the cache a page's first request then hits)."""
        for key in self.keys:
            self.curve(key, n_out)

    def summary(self) -> dict[str, Any]:
        return {"rows": self.rows, "skipped": self.skipped, "skipped_examples": list(self.skipped_examples),
                "keys": self.keys, "bytes_indexed": self.offset}
