"""What the training loop observes besides its own metrics (docs/evaluation.md): per-stage timings
(``time/<stage>_s``), system metrics of the run's process tree (``system/...``), JSON log lines in
``RUN/logs/`` and the optional metric sinks, all from ``logging:`` in the run config. The log lines are
``RunLogs``: the compose functions open them before they build anything, so the start-up lines of engines,
gateways and rollout workers land in the run's ``logs/`` too, and hand them to the loop, which closes them."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polar.config.sections import LoggingConfig
    from polar.trainers.run_dir import RunDir

from polar.metrics.heartbeat import Heartbeat
from polar.metrics.system import StageTimer

log = logging.getLogger(__name__)


class RunLogs:
    """The run's JSON log lines (``RUN/logs/<role>-<pid>.jsonl``, ``logging.structured_logs``) and
    ``POLAR_RUN_DIR`` for the processes started while they are open (rollout workers log there too)."""

    def __init__(self, logging_cfg: LoggingConfig, run_dir: RunDir, role: str = "learner") -> None:
        self.handler: logging.Handler | None = None
        if logging_cfg.structured_logs:
            from polar.metrics.logs import install_run_logging

            self.handler = install_run_logging(run_dir.path, role)
            os.environ["POLAR_RUN_DIR"] = str(run_dir.path)

    def close(self) -> None:
        if self.handler is not None:
            from polar.metrics.logs import remove_run_logging

            remove_run_logging(self.handler)
            self.handler = None
            os.environ.pop("POLAR_RUN_DIR", None)


class Observability:
    """``logs``: the run's log lines when the compose function opened them already (else opened here); closed
    with the rest by ``close``. ``heartbeat``: a line every 30 s while a long stage (an update, a weight push,
    an evaluation) runs and nothing else logged."""

    def __init__(self, logging_cfg: LoggingConfig, run_dir: RunDir, run_name: str, role: str = "learner",
                 logs: RunLogs | None = None) -> None:
        self.timer = StageTimer()
        self.heartbeat = Heartbeat()
        self.sampler = None
        self.sinks: list[Any] = []
        self.logs = logs if logs is not None else RunLogs(logging_cfg, run_dir, role)
        try:
            if logging_cfg.system_metrics_s > 0:
                from polar.metrics.system import SystemSampler

                self.sampler = SystemSampler(role, interval_s=logging_cfg.system_metrics_s).start()
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
        self.heartbeat.close()
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        self.logs.close()
