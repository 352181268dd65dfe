"""Trajectory samples as Arrow tables and Parquet files (one row per sample), and back.

Token arrays are Arrow list columns (int32 ids, int8 mask, float64 logprobs so recorded values
round-trip exactly); ``metadata`` is a JSON string column. Nothing here unpickles anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from polar.errors import PolarError
from polar.types import TrajectorySample

SCHEMA = pa.schema(
    [
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("logprobs", pa.list_(pa.float64()), nullable=False),
        pa.field("policy_versions", pa.list_(pa.int64()), nullable=False),
        pa.field("call_indices", pa.list_(pa.int32()), nullable=False),
        pa.field("reward", pa.float64()),
        pa.field("group_id", pa.string()),
        pa.field("metadata", pa.string()),  # JSON
    ],
    metadata={b"polar.schema": b"trajectory/v1"},
)


def _check(sample: TrajectorySample, index: int) -> None:
    n = len(sample.token_ids)
    for name in ("loss_mask", "logprobs", "policy_versions", "call_indices"):
        if len(getattr(sample, name)) != n:
            raise PolarError(
                f"trajectory sample {index} (session {sample.session_id!r}): {name} has "
                f"{len(getattr(sample, name))} entries but token_ids has {n}"
            )


def to_arrow(samples: Iterable[TrajectorySample]) -> pa.Table:
    """Samples → an Arrow table with :data:`SCHEMA`."""
    cols: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
    for i, s in enumerate(samples):
        _check(s, i)
        cols["session_id"].append(s.session_id)
        cols["token_ids"].append(s.token_ids)
        cols["loss_mask"].append(s.loss_mask)
        cols["logprobs"].append(s.logprobs)
        cols["policy_versions"].append(s.policy_versions)
        cols["call_indices"].append(s.call_indices)
        cols["reward"].append(s.reward)
        cols["group_id"].append(s.group_id)
        cols["metadata"].append(json.dumps(s.metadata, sort_keys=True))
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def from_arrow(table: pa.Table) -> list[TrajectorySample]:
    """An Arrow table with :data:`SCHEMA`'s columns → samples."""
    missing = [f.name for f in SCHEMA if f.name not in table.column_names]
    if missing:
        raise PolarError(f"not a polar trajectory table: missing columns {missing}")
    rows = table.select([f.name for f in SCHEMA]).to_pylist()
    out = []
    for r in rows:
        r["metadata"] = json.loads(r["metadata"]) if r["metadata"] else {}
        out.append(TrajectorySample(**r))
    return out


def write_parquet(samples: Iterable[TrajectorySample], path: str | Path) -> Path:
    """Write samples to one Parquet file (zstd); parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(to_arrow(samples), path, compression="zstd")
    return path


def read_parquet(path: str | Path) -> list[TrajectorySample]:
    """Read samples written by :func:`write_parquet` (or any file with the same columns)."""
    path = Path(path)
    if not path.is_file():
        raise PolarError(f"trajectory file {path} does not exist")
    return from_arrow(pq.read_table(path))
