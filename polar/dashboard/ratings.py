"""Human ratings of sessions and episodes: ``RUN/ratings.jsonl``, append-only, and what is made of them.

One line per rating::

    {"id", "time", "kind": "session"|"episode", "target", "task_id", "score": 1-5, "comment", "reward"}

``target`` is a session id, or ``<recording tag>/<episode id>`` for an episode. A later rating of the same
target supersedes an earlier one (the file is never rewritten). ``reward`` is the verifier's reward (the
episode's return) when the rating was made. ``task_id``: the session's task; for an episode,
``<env>:seed=<seed>``, so episodes from the same start are compared with each other.

Each rating is one ``write`` of one line to a file opened with ``O_APPEND``, then fsynced: concurrent
writers never interleave within a line, and a reader skips a torn last line.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import uuid
from itertools import combinations
from pathlib import Path
from typing import Any

SCORE_MIN, SCORE_MAX = 1, 5
MAX_COMMENT = 10_000
_lock = threading.Lock()


class RatingError(ValueError):
    """A rating that cannot be stored; the message names the field."""


def validate(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RatingError("the rating must be a JSON object with kind, target, score and comment")
    kind = body.get("kind")
    if kind not in ("session", "episode"):
        raise RatingError(f"'kind' must be 'session' or 'episode' (got {kind!r})")
    target = body.get("target")
    if not isinstance(target, str) or not target or len(target) > 300:
        raise RatingError("'target' must be the session id or '<tag>/<episode id>' (a non-empty string)")
    score = body.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score) \
            or not SCORE_MIN <= score <= SCORE_MAX:
        raise RatingError(f"'score' must be a number from {SCORE_MIN} to {SCORE_MAX} (got {score!r})")
    comment = body.get("comment", "")
    if not isinstance(comment, str):
        raise RatingError("'comment' must be a string")
    if len(comment) > MAX_COMMENT:
        raise RatingError(f"'comment' has {len(comment)} characters; at most {MAX_COMMENT}")
    return {"kind": kind, "target": target, "score": float(score), "comment": comment}


def append(run_path: Path, rating: dict[str, Any]) -> dict[str, Any]:
    """Store one validated rating (plus id and time); returns the stored row."""
    row = {"id": uuid.uuid4().hex[:12], "time": time.time(), **rating}
    data = (json.dumps(row) + "\n").encode()
    path = Path(run_path) / "ratings.jsonl"
    with _lock:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # a planted link: refused
        try:
            n = os.write(fd, data)
            if n != len(data):
                raise OSError(f"short write to {path} ({n} of {len(data)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
    return row


def read(run_path: Path) -> tuple[list[dict[str, Any]], int]:
    """All ratings (oldest first) and how many lines were unreadable."""
    path = Path(run_path) / "ratings.jsonl"
    rows, skipped = [], 0
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return [], 0
    for line in lines:
        try:
            row = json.loads(line)
            validate(row)
        except (ValueError, RatingError):
            skipped += 1
            continue
        rows.append(row)
    return rows, skipped


def latest(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The rating that counts for each (kind, target): the last one."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        out[(r["kind"], r["target"])] = r
    return out


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How often people and the verifier order two items of the same task alike.

    Over every pair of rated items of one task whose scores differ and whose rewards differ, ``agree``
    counts the pairs where the higher-scored item also has the higher reward."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in latest(rows).values():
        if isinstance(r.get("reward"), (int, float)):
            by_task.setdefault(str(r.get("task_id")), []).append(r)
    pairs = agree = 0
    for items in by_task.values():
        for a, b in combinations(items, 2):
            ds, dr = a["score"] - b["score"], a["reward"] - b["reward"]
            if ds == 0 or dr == 0:
                continue
            pairs += 1
            agree += (ds > 0) == (dr > 0)
    return {"rated": len(latest(rows)), "pairs": pairs, "agree": agree,
            "rate": agree / pairs if pairs else None}


def preference_pairs(rows: list[dict[str, Any]], texts: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Chosen vs rejected, per task: every pair of rated items of one task with different scores.

    ``texts`` maps (kind, target) to ``{"prompt", "response"}`` (what the items said)."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in latest(rows).values():
        by_task.setdefault(str(r.get("task_id")), []).append(r)
    out = []
    for task, items in sorted(by_task.items()):
        items.sort(key=lambda r: -r["score"])
        for a, b in combinations(items, 2):
            if a["score"] == b["score"]:
                continue
            ta, tb = texts.get((a["kind"], a["target"]), {}), texts.get((b["kind"], b["target"]), {})
            out.append({"task_id": task, "kind": a["kind"], "prompt": ta.get("prompt") or tb.get("prompt"),
                        "chosen_id": a["target"], "chosen": ta.get("response"), "chosen_score": a["score"],
                        "chosen_reward": a.get("reward"), "chosen_comment": a.get("comment", ""),
                        "rejected_id": b["target"], "rejected": tb.get("response"), "rejected_score": b["score"],
                        "rejected_reward": b.get("reward"), "rejected_comment": b.get("comment", "")})
    return out


def export(run_path: Path, out: Path, fmt: str = "jsonl") -> int:
    """Write the run's preference pairs to ``out`` (JSONL or Parquet); returns how many."""
    from polar.dashboard.runs import Run

    run_path = Path(run_path)
    rows, _ = read(run_path)
    run = Run(run_path.parent, run_path)
    texts = {}
    for kind, target in latest(rows):
        try:
            texts[(kind, target)] = run.target_info(kind, target)
        except (KeyError, OSError, ValueError):
            texts[(kind, target)] = {}
    pairs = preference_pairs(rows, texts)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = ["task_id", "kind", "prompt", "chosen_id", "chosen", "chosen_score", "chosen_reward", "chosen_comment",
                "rejected_id", "rejected", "rejected_score", "rejected_reward", "rejected_comment"]
        types = {"chosen_score": pa.float64(), "chosen_reward": pa.float64(), "rejected_score": pa.float64(),
                 "rejected_reward": pa.float64()}
        schema = pa.schema([pa.field(c, types.get(c, pa.string())) for c in cols],
                           metadata={b"polar.schema": b"preferences/v1"})
        table = pa.Table.from_pylist([{c: p.get(c) for c in cols} for p in pairs], schema=schema)
        pq.write_table(table, tmp)
    else:
        tmp.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    os.replace(tmp, out)
    return len(pairs)
