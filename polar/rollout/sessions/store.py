"""Finished sessions, kept in the run directory so people can look at them later (``polar dashboard``)::

    RUN/sessions/index.jsonl               one JSON object per finished session (no token arrays): id, task_id,
                                           group_id, status, reward, verifier_output, output, timings,
                                           builder_stats (prefix-merge breaks), metadata (rollout_step or eval
                                           tag), ``step`` (the GRPO step that learned from it, metrics.jsonl
                                           ``step``), ``records`` (the folder of its gateway call records,
                                           relative to RUN) and ``trajectory`` (the Parquet file of its samples)
    RUN/sessions/trajectories/b_*.parquet  the batch's samples: polar.trajectory.io's schema plus ``token_text``
                                           (each token's text, decoded with the model's tokenizer)

Writes are append-only and happen after a batch finished; a failure to write is logged, never raised:
training does not stop because the record of what it saw could not be kept.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from polar.rollout.sessions.session import SessionResult

log = logging.getLogger(__name__)


class SessionStore:
    def __init__(self, root: str | Path, records_dir: str | Path | None = None, tokenizer: Any = None) -> None:
        self.root = Path(root)
        self.records_dir = Path(records_dir) if records_dir is not None else None
        self.tokenizer = tokenizer
        self._lock = threading.Lock()

    def _records_rel(self) -> str | None:
        if self.records_dir is None:
            return None
        try:
            return os.path.relpath(self.records_dir, self.root.parent)
        except ValueError:
            return str(self.records_dir)

    def _token_text(self, ids: list[int]) -> list[str]:
        tok = self.tokenizer
        if tok is None or not ids:
            return []
        try:
            return list(tok.batch_decode([[int(i)] for i in ids]))
        except Exception as e:  # a tokenizer that cannot decode single ids: the trace shows ids instead
            log.debug("cannot decode token ids for the session store: %s", e)
            return []

    def append(self, results: Iterable[SessionResult]) -> None:
        """Record finished sessions (one batch). Never raises."""
        results = list(results)
        if not results:
            return
        try:
            self._append(results)
        except Exception as e:
            log.warning("could not record %d sessions in %s: %s", len(results), self.root, e)

    def _append(self, results: list[SessionResult]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from polar.trajectory.io import to_arrow

        traj_dir = self.root / "trajectories"
        traj_dir.mkdir(parents=True, exist_ok=True)
        samples = [s for r in results for s in r.samples]
        name = None
        if samples:
            name = f"b_{time.strftime('%Y%m%d-%H%M%S')}_{uuid.uuid4().hex[:8]}.parquet"
            table = to_arrow(samples)
            texts = [self._token_text(s.token_ids) for s in samples]
            table = table.append_column("token_text", pa.array(texts, pa.list_(pa.string())))
            tmp = traj_dir / f".{name}.tmp"
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, traj_dir / name)
        records = self._records_rel()
        lines = []
        for r in results:
            row = r.to_dict(with_samples=False)
            step = r.metadata.get("rollout_step")
            row.update(step=int(step) + 1 if isinstance(step, int) else None, records=records,
                       trajectory=f"trajectories/{name}" if name and r.samples else None,
                       num_samples=len(r.samples), tokens=sum(len(s.token_ids) for s in r.samples),
                       trainable_tokens=sum(sum(s.loss_mask) for s in r.samples), written_at=time.time())
            lines.append(json.dumps(row, default=str) + "\n")
        with self._lock, open(self.root / "index.jsonl", "a") as f:
            f.write("".join(lines))
