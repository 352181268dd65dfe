"""Metrics sinks shared by every trainer: ``metrics.jsonl`` (one object per line) and TensorBoard."""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polar.errors import RunDirError, os_cause

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from polar.metrics.sinks import MetricSink

log = logging.getLogger(__name__)


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsLogger:
    """Append-only JSONL plus optional TensorBoard scalars (imported lazily: it is slow to import).

    ``purge_step``: a resumed run passes its checkpoint's step + 1, and TensorBoard drops the events a run
    that died after that checkpoint had written from that step on, so its steps never go back
    (``RunDir.cut_metrics_after`` does the same for ``metrics.jsonl``).
    """

    def __init__(self, jsonl_path: str | Path, tensorboard_dir: str | Path | None = None,
                 purge_step: int | None = None, sinks: list[MetricSink] | None = None) -> None:
        self.path = Path(jsonl_path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)
        self._tb_dir = tensorboard_dir
        self._tb: SummaryWriter | None = None
        self._purge_step = purge_step
        self.sinks = list(sinks or [])  # polar.metrics.sinks: W&B, MLflow, OTel (off unless configured)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        row = {k: _clean(v) for k, v in metrics.items()}
        try:
            self._f.write(json.dumps(row) + "\n")
        except OSError as e:  # disk full, the run directory gone: one line, not a traceback from deep inside
            raise RunDirError(f"cannot write metrics to {self.path}: {os_cause(e)}") from None
        if self._tb_dir is not None:
            tb = self._tb
            if tb is None:
                from torch.utils.tensorboard import SummaryWriter

                tb = self._tb = SummaryWriter(str(self._tb_dir), purge_step=self._purge_step)
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    tb.add_scalar(k, v, step)
        for sink in list(self.sinks):
            try:
                sink.log(row, step)
            except Exception as e:  # a remote tracker down must not stop training; the JSONL has every row
                log.warning("metric sink %s failed (%s: %s); it is dropped for the rest of the run",
                            type(sink).__name__, type(e).__name__, e)
                self.sinks.remove(sink)

    def flush(self) -> None:
        self._f.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:
                log.warning("metric sink %s failed to close: %s", type(sink).__name__, e)
        self.sinks = []


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl; a torn last line (crash mid-write) is skipped."""
    rows: list[dict[str, Any]] = []
    p = Path(path)
    if not p.is_file():
        return rows
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class EpisodeWindow:
    """The last ``size`` finished episodes: returns, lengths, success flags."""

    def __init__(self, size: int = 100) -> None:
        self.returns: deque[float] = deque(maxlen=size)
        self.lengths: deque[int] = deque(maxlen=size)
        self.successes: deque[float] = deque(maxlen=size)
        self.total_episodes = 0

    def add(self, returns: Sequence[float], lengths: Sequence[int], successes: Iterable[float] = ()) -> None:
        self.returns.extend(returns)
        self.lengths.extend(lengths)
        self.successes.extend(successes)
        self.total_episodes += len(returns)

    @property
    def full(self) -> bool:
        return len(self.returns) == self.returns.maxlen

    def summary(self) -> dict[str, float | None]:
        def mean(xs: deque[float] | deque[int]) -> float | None:
            return (sum(xs) / len(xs)) if xs else None

        return {"episode_reward_mean": mean(self.returns), "episode_len_mean": mean(self.lengths),
                "success_rate": mean(self.successes), "episodes": self.total_episodes}

    def state_dict(self) -> dict[str, Any]:
        return {"returns": list(self.returns), "lengths": list(self.lengths), "successes": list(self.successes),
                "total": self.total_episodes}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.returns.extend(s["returns"])
        self.lengths.extend(s["lengths"])
        self.successes.extend(s["successes"])
        self.total_episodes = s["total"]
