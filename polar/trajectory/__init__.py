"""Trajectory builders (``per_request``, ``prefix_merging``) over gateway call records, and their
Arrow/Parquet form. See :mod:`polar.trajectory.builders`."""

from __future__ import annotations

from polar.trajectory.builders import BUILDERS, ReconstructionStats, build, per_request, prefix_merging

__all__ = [
    "BUILDERS",
    "ReconstructionStats",
    "build",
    "from_arrow",
    "per_request",
    "prefix_merging",
    "read_parquet",
    "to_arrow",
    "write_parquet",
]


def __getattr__(name: str):  # pyarrow loads only when Arrow output is asked for
    if name in ("to_arrow", "from_arrow", "write_parquet", "read_parquet", "SCHEMA"):
        from polar.trajectory import io

        return getattr(io, name)
    raise AttributeError(f"module 'polar.trajectory' has no attribute {name!r}")
