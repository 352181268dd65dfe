"""Task files: JSONL, one JSON object per line with at least a ``prompt`` (or ``instruction``/``question``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polar.errors import ConfigError


def resolve(path: str, config_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and config_dir is not None and (config_dir / p).exists():
        return config_dir / p
    return p


def read_jsonl(p: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, value)`` for each non-blank line; a bad line is a ConfigError naming it."""
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None


def load_tasks(path: str, config_dir: Path | None = None) -> list[dict[str, Any]]:
    p = resolve(path, config_dir)
    if not p.is_file():
        raise ConfigError(f"tasks file {path!r} not found (looked in {config_dir or Path.cwd()}); give a JSONL path")
    tasks: list[dict[str, Any]] = []
    first_line: dict[str, int] = {}
    for n, row in read_jsonl(p):
        if not isinstance(row, dict) or not any(isinstance(row.get(k), str) for k in ("prompt", "instruction", "question")):
            raise ConfigError(f"{p}:{n}: each task needs a 'prompt' string (or 'instruction'/'question')")
        row.setdefault("id", f"{p.stem}-{n}")
        # the id keys a task's groups, its records and its pass-rate estimate: two tasks must not share one
        task_id = str(row["id"])
        if task_id in first_line:
            same = sum(str(r["id"]) == task_id for r in tasks) + 1
            every = " (so far every task has it)" if same == len(tasks) + 1 else ""
            raise ConfigError(f"{p}:{n}: task id {task_id!r} is already the id of line {first_line[task_id]}{every}; "
                              "give each task its own 'id', or drop the 'id' fields and polar numbers them by line")
        first_line[task_id] = n
        tasks.append(row)
    if not tasks:
        raise ConfigError(f"{p} holds no tasks")
    return tasks
