"""``GET /sessions/{id}/trajectory?builder=...``: run a trajectory builder over a session's records."""

from __future__ import annotations

from typing import Any

from polar.gateway.errors import ApiError, bad
from polar.types import CallRecord

BUILDERS = ("per_request", "prefix_merging")


def trajectory_response(session_id: str, records: list[CallRecord], builder: str) -> dict[str, Any]:
    if builder not in BUILDERS:
        raise bad(f"unknown builder {builder!r}; use one of {', '.join(BUILDERS)}", "builder")
    try:
        from polar.trajectory import build
    except ImportError as e:
        raise ApiError("server_error", f"trajectory builders are not available: {e}") from None
    samples, stats = build(records, builder)
    return {"session_id": session_id, "builder": builder,
            "samples": [s.to_dict() for s in samples], "stats": stats}
