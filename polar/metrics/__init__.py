"""Metric sinks (JSONL, TensorBoard) and the rolling episode window."""

from polar.metrics.logger import EpisodeWindow, MetricsLogger, read_metrics

__all__ = ["EpisodeWindow", "MetricsLogger", "read_metrics"]
