"""``GET /sessions/{id}/trajectory?builder=...``: run a trajectory builder over a session's records."""

from __future__ import annotations

from typing import Any

from polar.gateway.errors import bad
from polar.trajectory import build
from polar.types import CallRecord

BUILDERS = ("per_request", "prefix_merging")


def trajectory_response(session_id: str, records: list[CallRecord], builder: str) -> dict[str, Any]:
    if builder not in BUILDERS:
        raise bad(f"unknown builder {builder!r}; use one of {', '.join(BUILDERS)}", "builder")
    samples, stats = build(records, builder)
    return {"session_id": session_id, "builder": builder,
            "samples": [s.to_dict() for s in samples], "stats": stats}
