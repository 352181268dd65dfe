"""Tokens/s through polar's gateway in front of a real vLLM CPU server, against calling that vLLM directly,
and polar's embedded engine on the same model, at several concurrencies. One run, same machine.

    make vllm && .venv/bin/python benchmarks/gateway_vs_vllm.py [--model smollm2-135m] [--concurrency 1 16 64]

Processes (all on 127.0.0.1):

- vllm: one replica launched through polar's own launcher (``polar.inference.vllm_launcher``), compiled
  (not ``enforce_eager``), ``--dtype bfloat16``, ``max_model_len`` 2048, a 2 GiB KV cache;
- gateway: ``polar gateway --model vllm:<that replica>`` in its own interpreter: it renders the chat
  template, tokenizes, sends token ids to vLLM's ``/v1/completions``, detokenizes, records every call;
- embedded: ``polar gateway --model FOLDER`` (the embedded engine, ``OMP_NUM_THREADS`` = the cores),
  started after vLLM is stopped so the two engines never share the cores;
- load: closed-loop async clients in this process; every request is a distinct chat completion
  (``max_tokens`` 64, temperature 1, the same prompt asking for a story), non-streamed.

Direct vLLM is ``POST /v1/chat/completions`` on vLLM itself (it renders and tokenizes there). Each path's
tokens/s is the completion tokens (``usage``) of the measured requests over their wall time; one warm-up
round of ``concurrency`` requests precedes each measurement. Direct and gateway alternate within each
concurrency (``--repeats`` times each) so a load change on the machine hits both; the table shows medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "Write a long story about a lighthouse keeper and a storm."


async def load(url: str, model: str, concurrency: int, n_requests: int, max_tokens: int,
               session_paths: bool) -> dict[str, Any]:
    """Closed loop: ``concurrency`` workers, one keep-alive connection each; ``n_requests`` measured after
    a warm-up round of ``concurrency``."""
    async def one(client: httpx.AsyncClient, url: str, i: int) -> int:
        body = {"model": model, "max_tokens": max_tokens, "temperature": 1.0,
                "messages": [{"role": "user", "content": f"{PROMPT} (story {i})"}]}
        r = await client.post(url, json=body)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    async def run(total: int, tag: str) -> tuple[int, int, float]:
        remaining = total
        tokens = errors = 0

        async def worker(w: int) -> None:
            nonlocal remaining, tokens, errors
            target = url.replace("{sid}", f"bench-{tag}-{w}") if session_paths else url
            limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            async with httpx.AsyncClient(limits=limits, timeout=600) as client:
                while remaining > 0:
                    remaining -= 1
                    try:
                        got = await one(client, target, remaining)
                    except httpx.HTTPError:
                        errors += 1
                        continue
                    tokens += got  # after the await: `tokens += await ...` would read tokens before it

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return tokens, errors, time.perf_counter() - t0

    await run(concurrency, f"warm{concurrency}")
    tokens, errors, elapsed = await run(n_requests, f"c{concurrency}-{time.monotonic_ns()}")
    return {"tokens": tokens, "errors": errors, "elapsed_s": elapsed, "tokens_per_s": tokens / elapsed,
            "tokens_per_request": tokens / max(1, n_requests - errors)}


def start_gateway(model_spec: str, records: Path, extra_yaml: str, threads: int, log: Path) -> tuple[subprocess.Popen, str]:
    import re

    cfg = records.parent / f"{records.name}.yaml"
    cfg.write_text(extra_yaml)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "COLUMNS": "300"}
    from polar.lifetime import popen_tied

    proc = popen_tied(  # dies with this script, however it ends
        [sys.executable, "-m", "polar.cli.main", "gateway", "--model", model_spec, "--config", str(cfg),
         "--records-dir", str(records)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
        start_new_session=True, pdeathsig=signal.SIGTERM)
    lines = []
    while True:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError("polar gateway exited:\n" + "".join(lines[-20:]))
        lines.append(line)
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if m:
            break
    log.write_text("".join(lines))

    def drain() -> None:  # keep reading, or a chatty gateway would block on a full pipe
        with open(log, "a") as fh:
            for line in proc.stderr:
                fh.write(line)

    threading.Thread(target=drain, daemon=True).start()
    return proc, m.group(1)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def requests_for(concurrency: int, scale: float) -> int:
    return max(4, int(scale * {1: 6, 16: 48, 64: 128}.get(concurrency, 2 * concurrency)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a preset or a local HF folder")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the requests per measurement")
    ap.add_argument("--no-embedded", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()

    from polar.inference.vllm_launcher import VllmFleet, VllmLaunchConfig, resolve_model_folder

    folder = resolve_model_folder(args.model)
    name = folder.name
    tmp = Path(tempfile.mkdtemp(prefix="polar-gw-vs-vllm-"))
    threads = os.cpu_count() or 2
    results: dict[str, Any] = {"model": str(folder), "max_tokens": args.max_tokens, "rows": {}}

    t0 = time.perf_counter()
    fleet = VllmFleet(folder, 1, VllmLaunchConfig(kv_cache_space_gib=2), tmp / "vllm").start()
    results["vllm_start_s"] = time.perf_counter() - t0
    print(f"vLLM up in {results['vllm_start_s']:.0f}s at {fleet.urls[0]}", flush=True)
    gw = None
    try:
        gw, gw_url = start_gateway(f"vllm:{fleet.urls[0]}", tmp / "gw-records",
                                   json.dumps({"engine_kwargs": {"tokenizer": str(folder)}}), threads, tmp / "gw.log")
        paths = {"vllm direct": (f"{fleet.urls[0]}/v1/chat/completions", False),
                 "gateway -> vllm": (f"{gw_url}/s/{{sid}}/v1/chat/completions", True)}
        for c in args.concurrency:
            n = requests_for(c, args.scale)
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in paths}
            for _ in range(args.repeats):
                for label, (url, sessions) in paths.items():
                    r = asyncio.run(load(url, name, c, n, args.max_tokens, sessions))
                    runs[label].append(r)
                    print(f"c={c:<3} {label:<16} {r['tokens_per_s']:7.1f} tok/s  ({r['tokens']} tokens, "
                          f"{r['elapsed_s']:.1f}s, errors {r['errors']})", flush=True)
            for label, rs in runs.items():
                results["rows"].setdefault(label, {})[c] = {
                    "tokens_per_s": statistics.median(x["tokens_per_s"] for x in rs),
                    "tokens_per_request": statistics.fmean(x["tokens_per_request"] for x in rs),
                    "errors": sum(x["errors"] for x in rs), "runs": [x["tokens_per_s"] for x in rs]}
    finally:
        if gw is not None:
            stop(gw)
        fleet.stop()

    if not args.no_embedded:
        emb, emb_url = start_gateway(str(folder), tmp / "emb-records", "{}", threads, tmp / "emb.log")
        try:
            for c in args.concurrency:
                r = asyncio.run(load(f"{emb_url}/s/{{sid}}/v1/chat/completions", name, c,
                                     requests_for(c, args.scale), args.max_tokens, True))
                print(f"c={c:<3} {'embedded':<16} {r['tokens_per_s']:7.1f} tok/s  ({r['tokens']} tokens, "
                      f"{r['elapsed_s']:.1f}s, errors {r['errors']})", flush=True)
                results["rows"].setdefault("embedded", {})[c] = {
                    "tokens_per_s": r["tokens_per_s"], "tokens_per_request": r["tokens_per_request"],
                    "errors": r["errors"], "runs": [r["tokens_per_s"]]}
        finally:
            stop(emb)

    results["machine"] = f"{platform.processor() or platform.machine()}, {threads} cores, load avg {os.getloadavg()}"
    report(results, args.concurrency)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


def report(results: dict[str, Any], concurrency: list[int]) -> None:
    rows = results["rows"]
    head = "| path | " + " | ".join(f"c={c} tok/s" for c in concurrency) + " |"
    print("\n" + head + "\n|" + "---|" * (len(concurrency) + 1))
    for label, by_c in rows.items():
        print(f"| {label} | " + " | ".join(f"{by_c[c]['tokens_per_s']:.1f}" for c in concurrency) + " |")
    direct = rows.get("vllm direct", {})
    for label in ("gateway -> vllm", "embedded"):
        if label in rows and direct:
            print(f"| {label} / direct | " + " | ".join(
                f"{rows[label][c]['tokens_per_s'] / direct[c]['tokens_per_s']:.2f}x" for c in concurrency) + " |")
    print(f"\nvLLM start {results['vllm_start_s']:.0f}s; tokens per request: " + ", ".join(
        f"{label} {statistics.fmean(v['tokens_per_request'] for v in by_c.values()):.1f}" for label, by_c in rows.items()))
    print(results.get("machine", ""))


if __name__ == "__main__":
    raise SystemExit(main())
