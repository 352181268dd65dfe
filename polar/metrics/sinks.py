"""Extra metric sinks beside ``metrics.jsonl`` and TensorBoard: Weights & Biases, MLflow, OpenTelemetry.

All are off by default and live behind extras (``pip install polar-rl[wandb]`` / ``[mlflow]`` / ``[otel]``);
a sink's library is imported only when that sink is built. A sink is anything with ``log(row, step)`` and
``close()``; :func:`register_sink` adds one by name (tests register an in-process fake).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

from polar.errors import ConfigError

log = logging.getLogger(__name__)


class MetricSink(Protocol):
    def log(self, row: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


_SINKS: dict[str, Callable[..., MetricSink]] = {}


def register_sink(name: str, factory: Callable[..., MetricSink]) -> None:
    """``factory(run_name=..., run_dir=..., **options) -> MetricSink``."""
    _SINKS[name] = factory


def sink_names() -> list[str]:
    return sorted(_SINKS)


def build_sink(name: str, run_name: str, run_dir: str | None = None, **options: Any) -> MetricSink:
    factory = _SINKS.get(name)
    if factory is None:
        raise ConfigError(f"metric sink {name!r} is unknown; known sinks: {', '.join(sink_names())}")
    return factory(run_name=run_name, run_dir=run_dir, **options)


def _numeric(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _require(module: str, extra: str) -> ModuleType:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"metric sink {extra!r} needs the {module!r} package, which is not installed; "
            f"pip install 'polar-rl[{extra}]' or remove {extra!r} from the sinks"
        ) from None


class WandbSink:
    """``wandb.init(project, name=run_name, mode)``; ``mode: offline`` writes under ``run_dir/wandb``."""

    def __init__(self, run_name: str, run_dir: str | None = None, project: str = "polar", mode: str = "offline",
                 **kwargs: Any) -> None:
        wandb = _require("wandb", "wandb")
        self.run = wandb.init(project=project, name=run_name, dir=run_dir, mode=mode, **kwargs)

    def log(self, row: dict[str, Any], step: int) -> None:
        self.run.log(_numeric(row), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run under ``tracking_uri`` (default: a file store in ``run_dir/mlruns``)."""

    def __init__(self, run_name: str, run_dir: str | None = None, tracking_uri: str | None = None,
                 experiment: str = "polar") -> None:
        mlflow = _require("mlflow", "mlflow")
        from pathlib import Path

        uri = tracking_uri or (Path(run_dir or ".") / "mlruns").resolve().as_uri()
        self.client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id

    def log(self, row: dict[str, Any], step: int) -> None:
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        metrics = [Metric(k.replace("/", "."), v, ts, step) for k, v in _numeric(row).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class OtelSink:
    """Each numeric metric as an OpenTelemetry gauge through the global ``MeterProvider`` (configure the
    exporter the usual OTel way, e.g. ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""

    def __init__(self, run_name: str, run_dir: str | None = None, meter: str = "polar") -> None:
        metrics = _require("opentelemetry.metrics", "otel")
        self.meter = metrics.get_meter(meter)
        self.run_name = run_name
        self.gauges: dict[str, Any] = {}

    def log(self, row: dict[str, Any], step: int) -> None:
        for k, v in _numeric(row).items():
            g = self.gauges.get(k)
            if g is None:
                g = self.gauges[k] = self.meter.create_gauge(k.replace("/", "."))
            g.set(v, {"run": self.run_name, "step": step})

    def close(self) -> None:
        pass


register_sink("wandb", WandbSink)
register_sink("mlflow", MlflowSink)
register_sink("otel", OtelSink)
