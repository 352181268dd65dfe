"""What the training loop observes besides its own metrics (docs/evaluation.md): per-stage timings
(``time/<stage>_s``), system metrics of the run's process tree (``system/...``), JSON log lines in
``RUN/logs/`` and the optional metric sinks, all from ``logging:`` in the run config."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polar.config.sections import LoggingConfig
    from polar.trainers.run_dir import RunDir

from polar.metrics.system import StageTimer

log = logging.getLogger(__name__)


class Observability:
    def __init__(self, logging_cfg: LoggingConfig, run_dir: RunDir, run_name: str, role: str = "learner") -> None:
        self.timer = StageTimer()
        self.sampler = None
        self.handler = None
        self.sinks: list[Any] = []
        if logging_cfg.structured_logs:
            import os

            from polar.metrics.logs import install_run_logging

            self.handler = install_run_logging(run_dir.path, role)
            os.environ["POLAR_RUN_DIR"] = str(run_dir.path)  # rollout workers started from here log there too
        if logging_cfg.system_metrics_s > 0:
            from polar.metrics.system import SystemSampler

            self.sampler = SystemSampler(role, interval_s=logging_cfg.system_metrics_s).start()
        try:
            from polar.metrics.sinks import build_sink

            for s in logging_cfg.sinks:
                self.sinks.append(build_sink(s.type, run_name=run_dir.path.name, run_dir=str(run_dir.path), **s.options))
        except BaseException:
            self.close()
            raise

    def row(self) -> dict[str, float]:
        """The stage times since the last row and the latest system sample."""
        out = self.timer.pop()
        if self.sampler is not None:
            out.update(self.sampler.snapshot())
        return out

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if self.handler is not None:
            from polar.metrics.logs import remove_run_logging

            remove_run_logging(self.handler)
            self.handler = None
            import os

            os.environ.pop("POLAR_RUN_DIR", None)
