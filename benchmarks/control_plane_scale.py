"""The control plane at scale: thousands of concurrent sessions through the gateway and the session pipeline,
with a zero-cost engine and a trivial harness, then a run's session store of 100,000 sessions in the dashboard.

    .venv/bin/python benchmarks/control_plane_scale.py                      # 2,000 sessions, 100,000 stored
    .venv/bin/python benchmarks/control_plane_scale.py --sessions 50 --stored 2000   # the smoke test's size

Processes (all on 127.0.0.1):

- gateway: ``GatewayServer`` in its own process around an engine that answers every call with 16 fixed ids at
  once (no model), with the hardening on: an admin token (sent to it in the environment, never on a command
  line), ``claimed_sessions_only`` (every session is claimed by the pipeline before its harness runs),
  per-session secret keys, the Host/Origin guard, body limits and one record per call;
- this process: ``SessionPipeline`` (INIT -> RUN -> POST_RUN, every stage as wide as the session count, so all
  sessions are in RUN at once), a ``NodeRegistry`` that claims sessions (``POST /admin/claim``) and reads
  their records back (``GET /sessions/{id}``) over HTTP, and a trivial harness: it waits until every session
  has started (so they really are concurrent), then makes ``--calls`` chat calls with its session's key;
- the finished sessions go to the run's ``sessions/index.jsonl`` (``rollout.sessions.store.SessionStore``);
  then a second run gets ``--stored`` session rows (the real rows, renamed) and the dashboard serves its
  first page of sessions from a cold start.

Reported: sessions/s (first submit to last result), calls/s while every session calls at once, the latency
of a model call through the gateway under that load (p50/p99; the engine costs nothing, so this is what the
gateway adds: with every session calling at once it is mostly the wait for the calls ahead), the gateway's
RSS and open file descriptors per concurrent session (peak minus idle, over the sessions), and records lost
(calls the harnesses made that are missing from what the pipeline read back or from the files on disk).

The soft open-files limit is raised to the hard limit in both processes when it is below what the session
count needs (two descriptors per session on each side, plus slack); the table says what it was.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
TOKEN_ENV = "POLAR_BENCH_ADMIN_TOKEN"  # the gateway's admin token reaches its process here, never on argv


# ---------------------------------------------------------------------------------------------- limits
def raise_nofile(needed: int) -> tuple[int, int, int]:
    """(soft before, soft after, hard): the soft RLIMIT_NOFILE raised toward ``needed`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    after = soft
    if soft != resource.RLIM_INFINITY and soft < needed:
        after = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (after, hard))
    return soft, after, hard


# ---------------------------------------------------------------------------------------------- gateway
def serve_gateway(port: int, records: str, needed_fds: int) -> None:
    """The gateway around a zero-cost engine, hardened; runs until SIGTERM."""
    from polar.config.gateway import GatewayConfig
    from polar.gateway.server import GatewayServer
    from polar.inference.base import Engine, GenerationRequest, TokenEvent
    from polar.inference.tiny import build_tiny_tokenizer

    class ZeroCostEngine(Engine):
        """16 fixed ids at once, logprob -0.5 each: no model, so what is measured is the control plane."""

        def __init__(self) -> None:
            self.tokenizer = build_tiny_tokenizer()
            self.model_name = "tiny"
            self.context_length = 32768
            self.policy_version = 0
            self.default_stop_token_ids = []
            self.ids = [100 + i for i in range(16)]

        async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
            n = min(len(self.ids), request.max_tokens)
            for i, tid in enumerate(self.ids[:n]):
                yield TokenEvent(tid, -0.5, "length" if i == n - 1 else None, 0 if i == n - 1 else None)

    raise_nofile(needed_fds)
    config = GatewayConfig(port=port, admin_token=os.environ[TOKEN_ENV], claimed_sessions_only=True,
                           default_max_tokens=16)
    GatewayServer(config, engine=ZeroCostEngine(), records_dir=records).start()
    threading.Event().wait()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout_s}s")


def usage(pid: int) -> tuple[int, int]:
    """(RSS bytes, open file descriptors) of process ``pid``."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


# ---------------------------------------------------------------------------------------------- sessions
class TrivialHarness:
    """Waits until every session has started, then makes ``calls`` chat calls with the session's own key over
    its own keep-alive connection (as a harness process would): polar's minimal HTTP/1.1 client, because
    httpx's pool rescans its queue on every request and would be what is measured at 2,000 sessions."""

    def __init__(self, sessions: int, calls: int) -> None:
        self.sessions = sessions
        self.calls = calls
        self.started = 0
        self.all_started = asyncio.Event()
        self.latencies_s: list[float] = []
        self.calls_ok = 0
        self.errors: list[str] = []
        self.released_at = 0.0  # when the last session started, and every harness began calling
        self.last_call_end = 0.0

    async def run(self, ctx: Any, timeout_s: float, cancel: asyncio.Event) -> Any:
        from polar.harness.agent.runners import HarnessOutcome

        self.started += 1
        if self.started >= self.sessions:
            self.released_at = time.perf_counter()
            self.all_started.set()
        await asyncio.wait_for(self.all_started.wait(), timeout_s)
        from polar.inference._http1 import Http1Pool, HttpError

        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Task {ctx.task['n']}: say something."}]
        pool = Http1Pool(ctx.openai_base_url, {"Authorization": f"Bearer {ctx.api_key}"}, max_idle=1)
        try:
            for i in range(self.calls):
                body = json.dumps({"model": ctx.model, "messages": messages, "max_tokens": 16}).encode()
                t0 = time.perf_counter()
                try:
                    status, data = await pool.post("/chat/completions", body, 300.0, 60.0)
                except HttpError as e:
                    self.errors.append(f"{type(e).__name__}: {e}")
                    continue
                self.last_call_end = time.perf_counter()
                self.latencies_s.append(self.last_call_end - t0)
                if status != 200:
                    self.errors.append(f"HTTP {status}: {data[:200]!r}")
                    continue
                self.calls_ok += 1
                answer = json.loads(data)["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"Go on ({i + 1})."}]
        finally:
            pool.close()
        return HarnessOutcome(output="done", returncode=0)


async def run_sessions(url: str, token: str, gw_pid: int, n: int, calls: int, run_dir: Path) -> dict[str, Any]:
    from polar.harness.agent.verifiers import NoVerifier
    from polar.rollout.sessions.nodes import NodeRegistry
    from polar.rollout.sessions.pipeline import PipelineSettings, SessionPipeline
    from polar.rollout.sessions.session import SessionSpec
    from polar.rollout.sessions.store import SessionStore

    harness = TrivialHarness(n, calls)
    registry = NodeRegistry()
    registry.register("gw", url, static=True, admin_token=token)
    settings = PipelineSettings(max_init_workers=n, max_run_workers=n, max_postrun_workers=n, session_budget_s=900,
                                agent_timeout_s=600, model_name="tiny", workspace_root=str(run_dir / "workspaces"))
    pipeline = SessionPipeline(harness, NoVerifier(), registry, settings)  # type: ignore[arg-type]
    idle_rss, idle_fds = usage(gw_pid)
    peak = {"rss": idle_rss, "fds": idle_fds}
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            rss, fds = usage(gw_pid)
            peak["rss"], peak["fds"] = max(peak["rss"], rss), max(peak["fds"], fds)
            await asyncio.sleep(0.05)

    sampler = asyncio.ensure_future(sample())
    t0 = time.perf_counter()
    tasks = [pipeline.submit(SessionSpec(session_id=f"s{i:06d}", task={"n": i}, task_id=f"t{i}")) for i in range(n)]
    results = await asyncio.gather(*tasks)
    elapsed_s = time.perf_counter() - t0
    done.set()
    await sampler
    await pipeline.aclose()
    await registry.aclose()
    t_store = time.perf_counter()
    SessionStore(run_dir / "sessions", records_dir=run_dir / "gateway" / "sessions").append(results)
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    lat = sorted(harness.latencies_s)
    return {
        "sessions": n, "calls_per_session": calls, "elapsed_s": elapsed_s, "sessions_per_s": n / elapsed_s,
        "calls_ok": harness.calls_ok, "calls_per_s": harness.calls_ok / max(1e-9, harness.last_call_end - harness.released_at), "call_errors": len(harness.errors), "first_errors": harness.errors[:3],
        "p50_ms": 1000 * lat[len(lat) // 2] if lat else float("nan"),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
        "records_read_back": sum(r.num_calls for r in results), "statuses": statuses,
        "idle_rss": idle_rss, "idle_fds": idle_fds, "peak_rss": peak["rss"], "peak_fds": peak["fds"],
        "store_append_s": time.perf_counter() - t_store,
    }


def records_on_disk(records_dir: Path) -> int:
    return sum(sum(1 for line in p.open("rb") if line.strip()) for p in records_dir.glob("*.jsonl"))


# ---------------------------------------------------------------------------------------------- dashboard
def fill_store(src: Path, dst_run: Path, stored: int) -> int:
    """``stored`` session rows in ``dst_run``'s index: the real rows of ``src``, renamed and repeated."""
    rows = [json.loads(line) for line in (src / "sessions" / "index.jsonl").read_text().splitlines() if line.strip()]
    (dst_run / "sessions").mkdir(parents=True)
    (dst_run / "run.json").write_text(json.dumps({"name": dst_run.name, "kind": "agent"}))
    with open(dst_run / "sessions" / "index.jsonl", "w") as f:
        for i in range(stored):
            row = dict(rows[i % len(rows)])
            row.update(session_id=f"stored-{i:07d}", step=i // 1000 + 1)
            f.write(json.dumps(row) + "\n")
    return (dst_run / "sessions" / "index.jsonl").stat().st_size


def dashboard_first_page(runs_root: Path, run_id: str) -> dict[str, float]:
    """Seconds to the first page of sessions from a cold dashboard, then to the next page and a far page."""
    from polar.dashboard.server import DashboardServer

    server = DashboardServer(runs_root).start()
    try:
        out: dict[str, float] = {}
        with httpx.Client(base_url=server.url, timeout=120) as c:
            for name, offset in (("first_page_s", 0), ("next_page_s", 100), ("last_page_s", None)):
                t0 = time.perf_counter()
                params: dict[str, Any] = {"run": run_id, "offset": offset if offset is not None else 0, "limit": 100}
                if offset is None:
                    total = out.get("total", 0)
                    params["offset"] = max(0, int(total) - 100)
                r = c.get("/api/sessions", params=params)
                out[name] = time.perf_counter() - t0
                r.raise_for_status()
                body = r.json()
                out["total"] = body["total"]
                if len(body["rows"]) != min(100, max(0, body["total"] - params["offset"])):
                    raise RuntimeError(f"page at offset {params['offset']} has {len(body['rows'])} rows of {body['total']}")
        return out
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--serve-gateway", nargs=3, metavar=("PORT", "RECORDS", "FDS"), help=argparse.SUPPRESS)
    ap.add_argument("--sessions", type=int, default=2000, help="concurrent sessions")
    ap.add_argument("--calls", type=int, default=2, help="model calls per session")
    ap.add_argument("--stored", type=int, default=100_000, help="sessions in the run store the dashboard pages")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.serve_gateway:
        serve_gateway(int(args.serve_gateway[0]), args.serve_gateway[1], int(args.serve_gateway[2]))
        return {}

    needed = 4 * args.sessions + 512
    soft0, soft, hard = raise_nofile(needed)
    tmp = Path(tempfile.mkdtemp(prefix="polar-cp-scale-"))
    run_dir = tmp / "runs" / "scale"
    records = run_dir / "gateway" / "sessions"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"name": "scale", "kind": "agent"}))
    token = secrets.token_hex(16)
    port = free_port()
    env = {**os.environ, TOKEN_ENV: token, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    gw = subprocess.Popen([sys.executable, __file__, "--serve-gateway", str(port), str(records), str(needed)], env=env,
                          stdout=subprocess.DEVNULL, stderr=open(tmp / "gateway.log", "w"), start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 120)
        res = asyncio.run(run_sessions(f"http://127.0.0.1:{port}", token, gw.pid, args.sessions, args.calls, run_dir))
    finally:
        if gw.poll() is None:
            os.killpg(gw.pid, signal.SIGTERM)  # the gateway writes its pending records and closes its files
            try:
                gw.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(gw.pid, signal.SIGKILL)
                gw.wait(10)
    expected = args.sessions * args.calls
    res.update(records_on_disk=records_on_disk(records), expected_records=expected,
               nofile_soft_before=soft0, nofile_soft=soft, nofile_hard=hard, load=os.getloadavg())
    res["records_lost"] = max(expected - res["records_read_back"], expected - res["records_on_disk"], 0)
    res["stored_bytes"] = fill_store(run_dir, tmp / "runs" / "stored", args.stored)
    res["stored"] = args.stored
    res.update(dashboard_first_page(tmp / "runs", "stored"))
    shutil.rmtree(tmp, ignore_errors=True)
    report(res)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return res


def report(r: dict[str, Any]) -> None:
    n = r["sessions"]
    print(f"\nload average {r['load'][0]:.2f} {r['load'][1]:.2f} {r['load'][2]:.2f} on {os.cpu_count()} cores; "
          f"open-files limit: soft {r['nofile_soft_before']}" + (f" -> raised to {r['nofile_soft']}" if r['nofile_soft'] != r['nofile_soft_before'] else "")
          + f" (hard {r['nofile_hard']})")
    print("\n| concurrent sessions | calls | sessions/s | calls/s | call p50 ms | call p99 ms | RSS per session "
          "| fds per session | records lost | statuses |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rss = (r["peak_rss"] - r["idle_rss"]) / n
    fds = (r["peak_fds"] - r["idle_fds"]) / n
    print(f"| {n} | {r['calls_ok']}/{r['expected_records']} | {r['sessions_per_s']:.1f} | {r['calls_per_s']:.0f} | "
          f"{r['p50_ms']:.1f} | "
          f"{r['p99_ms']:.1f} | {rss / 1024:.1f} KiB | {fds:.2f} | {r['records_lost']} | "
          + ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items())) + " |")
    print(f"\ngateway: idle {r['idle_rss'] / 2**20:.0f} MiB / {r['idle_fds']} fds, peak {r['peak_rss'] / 2**20:.0f} MiB / "
          f"{r['peak_fds']} fds; records read back {r['records_read_back']}, on disk {r['records_on_disk']}, "
          f"call errors {r['call_errors']}" + (f" (first: {r['first_errors']})" if r["call_errors"] else ""))
    print("\n| sessions stored | index.jsonl | dashboard first page (cold) | next page | last page |")
    print("|---|---|---|---|---|")
    print(f"| {r['stored']:,} | {r['stored_bytes'] / 2**20:.0f} MiB | {r['first_page_s']:.3f} s | "
          f"{r['next_page_s']:.3f} s | {r['last_page_s']:.3f} s |")


if __name__ == "__main__":
    main()
