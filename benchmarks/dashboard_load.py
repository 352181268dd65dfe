"""Dashboard load: a run with 10^6 metric rows and 10^4 agent sessions, opened in headless Chromium.

    .venv/bin/python benchmarks/dashboard_load.py [--rows 1000000] [--sessions 10000] [--repeats 5]

Measures, on the same machine:

- index: seconds from the dashboard's start until its in-memory index holds all of metrics.jsonl (one
  pass over the file, in the background, before any page asks);
- first curve: time from navigation start to the first curve drawn on the page (Chromium's
  ``performance.now()`` when the first chart with points is painted), index warm, median of ``--repeats``
  fresh pages;
- SSE update: wall time from appending one row to metrics.jsonl (as the metrics logger writes) to the
  new point being drawn in the open page (the page's ``Date.now()``), median and p95 of 30 appends;
- sessions: the sessions list (10^4) and one session's token trace through the API;
- naive: the same curves by re-reading and ``json.loads``-ing the whole file per request with no
  downsampling (what a dashboard without an index does), for the ratio.

Targets (issue 14): first curve under 1 s, updates under 250 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEYS = ["episode_reward_mean", "episode_len_mean", "pg_loss", "value_loss", "entropy", "approx_kl", "fps",
        "policy_lag", "learning_rate", "success_rate", "learner/samples_per_s", "connector/process_restarts",
        "system/learner/cpu_percent", "system/learner/rss_mb"]


def write_run(root: Path, rows: int, sessions: int) -> Path:
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq

    from polar.trainers.run_dir import RunDir
    from polar.trajectory.io import to_arrow
    from polar.types import TrajectorySample

    rd = RunDir.create("big", run_dir=root / "big", kind="agentic-grpo")
    rd.update_meta(status="finished")
    rng = random.Random(0)
    with open(rd.metrics_path, "wb") as f:
        buf = []
        for i in range(rows):
            row = {"iteration": i + 1, "env_steps": (i + 1) * 256, "step": i + 1, "time_s": i * 0.1}
            for j, k in enumerate(KEYS):
                row[k] = round(rng.gauss(j, 1.0) + i * 1e-5, 6)
            buf.append(orjson.dumps(row))
            if len(buf) == 10_000:
                f.write(b"\n".join(buf) + b"\n")
                buf = []
        if buf:
            f.write(b"\n".join(buf) + b"\n")
    sdir = rd.path / "sessions"
    (sdir / "trajectories").mkdir(parents=True)
    rec = rd.path / "gateway" / "sessions"
    rec.mkdir(parents=True)
    index = []
    per_file = 100
    for b in range(0, sessions, per_file):
        samples = []
        for i in range(b, min(sessions, b + per_file)):
            sid = f"ses-{i:08d}"
            n_prompt, n_out = 200, 60
            ids = [rng.randrange(1000) for _ in range(n_prompt + n_out)]
            samples.append(TrajectorySample(sid, ids, [0] * n_prompt + [1] * n_out, [0.0] * n_prompt + [-0.7] * n_out,
                                            [i // 100] * len(ids), [0] * len(ids), float(i % 2)))
            call = {"session_id": sid, "call_index": 0, "provider": "openai_chat", "model": "m",
                    "messages": [{"role": "user", "content": f"task {i}"}], "prompt_ids": ids[:n_prompt],
                    "sampled_ids": ids[n_prompt:], "logprobs": [-0.7] * n_out, "finish_reason": "stop",
                    "policy_version": i // 100, "started_at": 0.0, "ended_at": 0.5, "metadata": {"timings": {"ttft_s": 0.1}}}
            (rec / f"{sid}.jsonl").write_bytes(orjson.dumps(call) + b"\n")
            index.append({"session_id": sid, "task_id": f"t{i // 8}", "status": "done", "reward": float(i % 2),
                          "step": i // 100 + 1, "num_calls": 1, "records": "gateway/sessions",
                          "trajectory": f"trajectories/b_{b:08d}.parquet", "tokens": len(ids), "trainable_tokens": n_out,
                          "timings": {"total_s": 1.0}, "output": "answer"})
        table = to_arrow(samples).append_column("token_text", pa.array([[f"w{t}" for t in s.token_ids] for s in samples]))
        pq.write_table(table, sdir / "trajectories" / f"b_{b:08d}.parquet")
    (sdir / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    return rd.path


def naive_curves(path: Path, keys: list[str]) -> float:
    t = time.perf_counter()
    curves = {k: [] for k in keys}
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            for k in keys:
                if k in row:
                    curves[k].append((row["env_steps"], row[k]))
    json.dumps(curves)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--appends", type=int, default=30)
    ap.add_argument("--no-naive", action="store_true", help="skip the naive re-read (minutes at 10^6 rows)")
    ap.add_argument("--dir", default=None, help="keep the generated run here and reuse it on the next call")
    ap.add_argument("--chromium", default=os.environ.get("POLAR_CHROMIUM", "/usr/bin/chromium"))
    args = ap.parse_args()

    import httpx
    from playwright.sync_api import sync_playwright

    from polar.dashboard.server import DashboardServer

    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.dir or scratch
        t = time.perf_counter()
        run = Path(tmp) / "big"
        if not (run / "sessions" / "index.jsonl").is_file():
            run = write_run(Path(tmp), args.rows, args.sessions)
        size_mb = (run / "metrics.jsonl").stat().st_size / 2**20
        print(f"run of {args.rows} rows ({size_mb:.0f} MiB) and {args.sessions} sessions ready in "
              f"{time.perf_counter() - t:.1f}s", flush=True)
        t0 = time.perf_counter()
        srv = DashboardServer(tmp).start()
        srv.app.state.warm_done.wait()
        index_s = time.perf_counter() - t0
        print(f"index: {index_s:.2f}s", flush=True)
        http = httpx.Client(base_url=srv.url, timeout=120)
        t = time.perf_counter()
        http.get("/api/curves", params={"run": "big", "keys": ",".join(KEYS[:7]), "n": 1000}).raise_for_status()
        curves_s = time.perf_counter() - t
        t = time.perf_counter()
        lst = http.get("/api/sessions", params={"run": "big", "limit": 100}).json()
        list_s = time.perf_counter() - t
        assert lst["all"] == args.sessions, lst["all"]
        t = time.perf_counter()
        one = http.get("/api/session", params={"run": "big", "id": f"ses-{args.sessions // 2:08d}"}).json()
        session_s = time.perf_counter() - t
        assert one["samples"] and sum(one["samples"][0]["loss_mask"]) == 60
        naive_s = float("nan") if args.no_naive else naive_curves(run / "metrics.jsonl", KEYS[:7])

        first, lat, marks = [], [], []
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"])
            for _ in range(args.repeats):
                ctx = b.new_context(viewport={"width": 1280, "height": 860})
                page = ctx.new_page()
                page.goto(f"{srv.url}/?run=big")
                page.wait_for_function("window.__polar.firstCurveAt !== null", timeout=120_000)
                first.append(page.evaluate("window.__polar.firstCurveAt") / 1000)
                marks.append(page.evaluate("window.__polar.marks"))
                ctx.close()
            ctx = b.new_context(viewport={"width": 1280, "height": 860})
            page = ctx.new_page()
            page.goto(f"{srv.url}/?run=big")
            page.wait_for_function("window.__polar.firstCurveAt !== null", timeout=120_000)
            page.wait_for_function("document.querySelector('#conn').textContent === 'live'", timeout=60_000)
            rows = args.rows
            with open(run / "metrics.jsonl", "a", buffering=1) as f:
                for i in range(args.appends):
                    before = page.evaluate("window.__polar.updates")
                    rows += 1
                    row = {"iteration": rows, "env_steps": rows * 256, "step": rows,
                           **{k: float(i) for k in KEYS}}
                    sent = time.time() * 1000
                    f.write(json.dumps(row) + "\n")
                    page.wait_for_function(f"window.__polar.updates > {before}", timeout=30_000, polling=5)
                    lat.append((page.evaluate("window.__polar.lastUpdate.wall") - sent) / 1000)
                    time.sleep(0.2)
            b.close()
        srv.stop()

    med = statistics.median
    p95 = sorted(lat)[max(0, int(0.95 * len(lat)) - 1)]
    print()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{platform.platform()}")
    print(f"run: {args.rows} metric rows x {len(KEYS)} keys ({size_mb:.0f} MiB), {args.sessions} sessions")
    print("| measure | polar dashboard | target |")
    print("|---|---|---|")
    print(f"| index all of metrics.jsonl and downsample every curve at start (background) | {index_s:.2f} s | |")
    print(f"| first curve in Chromium, index warm (median of {args.repeats}) | {med(first) * 1000:.0f} ms "
          f"(min {min(first) * 1000:.0f}, max {max(first) * 1000:.0f}) | < 1 s |")
    parts = {k: med([m[k] for m in marks if k in m]) for k in ("script", "runs", "keys", "curves")}
    print(f"| of which (median ms since navigation): script start {parts['script']:.0f}, /api/runs {parts['runs']:.0f}, "
          f"/api/keys with the default curves {parts['keys']:.0f}, first curve drawn {med(first) * 1000:.0f} "
          f"(resource and event curves follow: {parts['curves']:.0f}) | | |")
    print(f"| SSE update: row appended -> point drawn (median / p95 of {len(lat)}) | {med(lat) * 1000:.0f} ms / "
          f"{p95 * 1000:.0f} ms | < 250 ms |")
    print(f"| /api/curves, 7 keys x 1000 points (LTTB) | {curves_s * 1000:.0f} ms | |")
    print(f"| naive: re-read + json.loads the whole file for the same 7 curves | {naive_s * 1000:.0f} ms "
          f"({naive_s / curves_s:.0f}x the indexed request) | |")
    print(f"| sessions list (100 of {args.sessions}) | {list_s * 1000:.0f} ms | |")
    print(f"| one session's token trace (260 tokens, its Parquet batch + call records) | {session_s * 1000:.0f} ms | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
