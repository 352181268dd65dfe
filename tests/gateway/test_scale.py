"""The control plane with many sessions at once: what broke at 2,000 concurrent sessions stays fixed.
(Timings are in ``benchmarks/control_plane_scale.py``; these tests check behaviour, never speed.)"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from polar.gateway.sessions import key_hash
from polar.types import new_session_key


def test_many_sessions_claimed_at_once_wait_in_the_registry_not_in_the_http_pool(gateway, scripted):
    """httpx's pool scans every waiting request each time one starts or ends: 2,000 sessions claiming at once
    through one registry took minutes. The registry now holds back all but a few, so its pool's queue stays
    as short as its connection count, and every claim still lands."""
    from polar.rollout.sessions.nodes import MAX_NODE_REQUESTS, NodeRegistry

    token = secrets.token_hex(16)
    gw = gateway(scripted(["ok"]), admin_token=token, claimed_sessions_only=True)
    n = 400
    keys = {f"sess-{i:04d}": new_session_key(f"sess-{i:04d}") for i in range(n)}

    async def claim_all() -> int:
        registry = NodeRegistry()
        node = registry.register("gw", gw.url, static=True, admin_token=token)
        seen: list[int] = [0]

        async def watch() -> None:
            while True:
                http: Any = registry._http
                if http is not None:
                    seen.append(len(http._transport._pool._requests))  # requests httpcore tracks (and scans)
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait_for(asyncio.gather(*(registry.claim(node, sid, key) for sid, key in keys.items())), 300)
        finally:
            watcher.cancel()
            await registry.aclose()
        return max(seen)

    most_in_pool = asyncio.run(claim_all())
    assert most_in_pool <= MAX_NODE_REQUESTS, f"{most_in_pool} requests queued in httpx's pool at once"
    store = gw.app.store
    assert all(store.owner(sid) == key_hash(key) for sid, key in keys.items())


def test_control_plane_benchmark_runs_at_small_scale_and_loses_no_record(tmp_path):
    """``benchmarks/control_plane_scale.py`` end to end (its own gateway process, the session pipeline, the
    dashboard) at 50 sessions and 2,000 stored: every call is recorded and the tables come out."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "control_plane_scale.py"
    out = tmp_path / "scale.json"
    p = subprocess.run([sys.executable, str(script), "--sessions", "50", "--calls", "2", "--stored", "2000",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["records_lost"] == 0 and r["records_on_disk"] == r["records_read_back"] == 100
    assert r["statuses"] == {"done": 50} and r["call_errors"] == 0
    assert r["total"] == 2000
    assert "| concurrent sessions |" in p.stdout and "| 50 | 100/100 |" in p.stdout
    assert "| sessions stored |" in p.stdout and "| 2,000 |" in p.stdout
