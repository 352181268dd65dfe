"""Gateway overhead: polar's gateway and the LiteLLM proxy, each in front of the same fast stand-in
upstream, against calling that upstream directly. One run, same machine, same load generator.

    .venv/bin/python benchmarks/gateway_overhead.py [--repeats 3] [--litellm-venv .bench-venvs/litellm]
    .venv/bin/python benchmarks/gateway_overhead.py --concurrency 1 --skip-litellm --repeats 6 \
        --baseline /tmp/old-tree   # also a gateway from another checkout (git worktree), alternating with this one

Set up the LiteLLM side once, in its own venv so it cannot disturb polar's:

    python3 -m venv .bench-venvs/litellm && .bench-venvs/litellm/bin/pip install "litellm[proxy]==1.108.7"

Processes (all on 127.0.0.1, each its own interpreter):

- upstream: polar's vLLM stand-in (``polar.testing.standin``, FixedEngine: 16 tokens at once, ids and
  logprobs as vLLM returns them) plus ``POST /v1/chat/completions`` in vLLM's documented shape, so
  the direct path and LiteLLM have a chat endpoint; it does the engine work ``/v1/completions`` does for
  polar (until 2026-12-07 it was a canned reply ~150 us cheaper, which counted the stand-in's own
  completions work as gateway overhead); with ``--direct-chat vllm`` it also renders the chat template,
  tokenizes and detokenizes, as vLLM's own chat endpoint does (work a gateway in front of vLLM takes over);
- polar: ``polar gateway --model vllm:<upstream>``: it renders the chat template, tokenizes, streams
  token ids from the upstream's ``/v1/completions``, detokenizes, and appends a record per call;
- polar-inproc: the same gateway around a zero-cost in-process engine (16 fixed ids): the gateway's
  own cost (HTTP, parsing, template, tokenizer, detokenizer, record) without the upstream client;
- bare-proxy: uvicorn + a raw ASGI app forwarding the body to the upstream's chat endpoint over the same
  keep-alive client polar uses, doing nothing else: the cost of one Python proxy hop on this machine;
- litellm: the LiteLLM proxy CLI (defaults: 1 worker, master key set as it requires);
- load: closed-loop async httpx clients in this process, one connection per worker.

"Added latency" is the path's p50 (p99) minus the direct p50 (p99) measured in the same repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
BODY = {
    "model": "tiny",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in one short sentence."},
    ],
    "max_tokens": 16,
}


# ---------------------------------------------------------------------------------------------- upstream
def serve_upstream(port: int, direct_chat: str = "engine") -> None:
    """The stand-in upstream (runs in its own process). ``direct_chat``: what its chat endpoint does besides
    the engine work (``engine``: nothing, a fixed prompt; ``vllm``: what vLLM's chat endpoint does around
    it: render the chat template, tokenize, and decode the answer, with the tiny tokenizer polar uses)."""
    import orjson
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from polar.inference.base import GenerationRequest
    from polar.testing.standin import FixedEngine, _drain, _json_body, make_app

    engine = FixedEngine(n_tokens=16)
    app = make_app(engine, "vllm", served_model="tiny")
    app.state.standin.requests = _NoLog()  # do not grow a request log for the whole benchmark
    fixed_prompt_ids = list(range(1, 33))  # direct_chat "engine": no tokenizer, a fixed 32-token prompt
    tokenizer = None
    if direct_chat == "vllm":
        from polar.inference.tiny import build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()

    async def chat(request: Request) -> Response:
        """The chat answer, after the same engine work ``/v1/completions`` does for polar (body parsed the
        same way, a validated GenerationRequest drained from the same engine, an id): a real vLLM does
        more for a chat call (template, tokenizer) than for a token-id completion, never less. With
        ``direct_chat == "vllm"`` it also does that more: vLLM's chat endpoint renders the model's chat
        template (transformers' sandboxed Jinja), tokenizes the rendering and detokenizes the answer,
        work a gateway in front of it takes over (it sends token ids to ``/v1/completions``)."""
        body = await _json_body(request)
        prompt_ids = fixed_prompt_ids
        if tokenizer is not None:
            text = tokenizer.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
            prompt_ids = tokenizer.encode(text, add_special_tokens=False)
        gen = GenerationRequest(prompt_ids=prompt_ids, max_tokens=int(body.get("max_tokens") or 16),
                                temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                                stop_token_ids=[], seed=body.get("seed"))
        gen.validate()
        ids, lps, finish = await _drain(engine, gen)
        content = "Paris is the capital of France, of course."
        if tokenizer is not None:
            content = tokenizer.decode(ids, skip_special_tokens=True)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(ids, lps, strict=True)]}
            if body.get("logprobs") else None,
            "finish_reason": finish,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        out = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model"), "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                      "total_tokens": len(prompt_ids) + len(ids)},
        }
        return Response(orjson.dumps(out), media_type="application/json")

    app.router.routes.append(Route("/v1/chat/completions", chat, methods=["POST"]))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=60,
                backlog=2048)


def serve_polar_in_process_engine(port: int, records: str) -> None:
    """polar's gateway around a zero-cost in-process engine: the gateway's own cost, no upstream hop."""
    from polar.config.gateway import GatewayConfig
    from polar.gateway.server import GatewayServer
    from polar.inference.tiny import build_tiny_tokenizer
    from polar.testing.standin import FixedEngine

    engine = FixedEngine(n_tokens=16)
    engine.tokenizer, engine.model_name, engine.default_stop_token_ids = build_tiny_tokenizer(), "tiny", []
    GatewayServer(GatewayConfig(port=port), engine=engine, records_dir=records).start()
    threading.Event().wait()  # the server runs on its own thread until SIGTERM ends the process


def serve_bare_proxy(port: int, upstream_port: int) -> None:
    """The floor of any Python proxy hop: uvicorn + a raw ASGI app that forwards the body to the upstream's
    chat endpoint over polar's keep-alive client, with no parsing, templating, tokenizing or recording."""
    import uvicorn

    from polar.inference._http1 import Http1Pool

    pool = Http1Pool(f"http://127.0.0.1:{upstream_port}", {})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":  # liveness, for the start-up wait
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        status, data = await pool.post("/v1/chat/completions", b"".join(chunks), 60, 5)
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, proxy_headers=False,
                lifespan="off", timeout_keep_alive=60, backlog=2048)


class _NoLog(list):
    def append(self, item: Any) -> None:
        pass


# ---------------------------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        try:
            if httpx.get(url, timeout=2, headers=headers).status_code < 500:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout_s}s")


def start(cmd: list[str], env: dict[str, str] | None = None, log: Path | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    out = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=cwd)


def tree_env(tree: Path) -> dict[str, str]:
    """``PYTHONPATH`` for a process that must import ``polar`` from ``tree``. A ``python -m`` process also
    puts its working directory first on ``sys.path``, so it is started in ``tree`` as well (before
    2026-12-07 stop 37 the baseline gateway, started with ``-m`` in the benchmark's own checkout, imported
    that checkout's ``polar``, not the baseline's: 'polar-baseline' was the same code as 'polar')."""
    rest = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(tree) + (os.pathsep + rest if rest else "")}


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def cpu_seconds(pid: int) -> float:
    try:
        import psutil

        p = psutil.Process(pid)
        total = sum(c.cpu_times().user + c.cpu_times().system for c in p.children(recursive=True))
        return total + p.cpu_times().user + p.cpu_times().system
    except Exception:
        return float("nan")


# ---------------------------------------------------------------------------------------------- load
async def load(url: str, concurrency: int, n_requests: int, warmup: int, cap_s: float,
               headers: dict[str, str], session_paths: bool) -> dict[str, Any]:
    """Closed loop: ``concurrency`` workers, each with its own one-connection client."""
    latencies: list[float] = []
    errors = 0
    remaining = warmup + n_requests
    done_warmup = asyncio.Event()
    counter = 0
    # every request is distinct (a counter in the user message), so no path can answer from a cache
    head, tail = json.dumps(BODY).encode().split(b"one short sentence.", 1)
    t_start = 0.0

    async def worker(i: int) -> None:
        nonlocal remaining, errors, counter, t_start
        target = url.replace("{sid}", f"bench-{i}") if session_paths else url
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(limits=limits, timeout=60, headers={**headers, "content-type": "application/json"}) as c:
            while remaining > 0:
                remaining -= 1
                body = b"%sone short sentence. (request %d of worker %d)%s" % (head, remaining, i, tail)
                t0 = time.perf_counter()
                try:
                    r = await c.post(target, content=body)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                dt = time.perf_counter() - t0
                if not ok:
                    errors += 1
                    continue
                counter += 1
                if counter == warmup:
                    t_start = time.perf_counter()
                    done_warmup.set()
                elif counter > warmup:
                    latencies.append(dt)
                if t_start and time.perf_counter() - t_start > cap_s:
                    remaining = 0

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - t_start
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n, "errors": errors, "elapsed_s": elapsed, "rps": n / elapsed,
        "p50_ms": 1000 * latencies[n // 2], "p99_ms": 1000 * latencies[min(n - 1, int(n * 0.99))],
        "mean_ms": 1000 * statistics.fmean(latencies),
    }


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--direct-chat", choices=("engine", "vllm"), default="engine",
                    help="what the stand-in's chat endpoint (the 'direct' path) does: 'engine': the engine work "
                         "of a token-id completion on a fixed prompt (the stop-35 tables); 'vllm': also what "
                         "vLLM's chat endpoint does around it (chat template, tokenize, detokenize)")
    ap.add_argument("--serve-polar-fixed", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--records", help=argparse.SUPPRESS)
    ap.add_argument("--serve-bare-proxy", type=int, nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--requests", type=int, nargs="+", default=[1000, 2000, 3000], help="per concurrency level")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--cap-s", type=float, default=30.0, help="stop a measurement after this long")
    ap.add_argument("--litellm-venv", default=str(ROOT / ".bench-venvs" / "litellm"))
    ap.add_argument("--skip-litellm", action="store_true")
    ap.add_argument("--out", default=None, help="write the raw results as JSON here")
    ap.add_argument("--baseline", default=None, metavar="TREE",
                    help="also run the gateway from this source tree (e.g. a git worktree of an older commit) as "
                         "'polar-baseline', measured in the same repeats as 'polar', for a before/after on a shared box")
    args = ap.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream, args.direct_chat)
        return 0
    if args.serve_polar_fixed:
        serve_polar_in_process_engine(args.serve_polar_fixed, args.records)
        return 0
    if args.serve_bare_proxy:
        serve_bare_proxy(*args.serve_bare_proxy)
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    py = sys.executable
    up_port, gw_port, ll_port, fx_port, bp_port = free_port(), free_port(), free_port(), free_port(), free_port()
    procs: dict[str, subprocess.Popen] = {}
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", **tree_env(ROOT)}
    try:
        procs["upstream"] = start([py, __file__, "--serve-upstream", str(up_port), "--direct-chat", args.direct_chat],
                                  env, tmp / "upstream.log")
        wait_http(f"http://127.0.0.1:{up_port}/health", 60)
        procs["polar"] = start([py, "-m", "polar.cli.main", "gateway", "--model", f"vllm:http://127.0.0.1:{up_port}",
                                "--port", str(gw_port), "--records-dir", str(tmp / "records")], env, tmp / "polar.log", ROOT)
        polar_start_s = wait_http(f"http://127.0.0.1:{gw_port}/health", 180)
        if args.baseline:
            bl_port = free_port()
            procs["polar-baseline"] = start(
                [py, "-m", "polar.cli.main", "gateway", "--model", f"vllm:http://127.0.0.1:{up_port}", "--port", str(bl_port),
                 "--records-dir", str(tmp / "records-baseline")],
                {**env, "PYTHONPATH": str(Path(args.baseline).resolve())}, tmp / "polar-baseline.log",
                Path(args.baseline).resolve())
            wait_http(f"http://127.0.0.1:{bl_port}/health", 180)
        procs["polar-inproc"] = start([py, __file__, "--serve-polar-fixed", str(fx_port), "--records", str(tmp / "records-inproc")],
                                      env, tmp / "polar-inproc.log")
        wait_http(f"http://127.0.0.1:{fx_port}/health", 180)
        procs["bare-proxy"] = start([py, __file__, "--serve-bare-proxy", str(bp_port), str(up_port)], env, tmp / "bare.log")
        wait_http(f"http://127.0.0.1:{bp_port}/", 60)
        targets = {
            "direct": (f"http://127.0.0.1:{up_port}/v1/chat/completions", {}, False),
            "polar": (f"http://127.0.0.1:{gw_port}/s/{{sid}}/v1/chat/completions", {}, True),
            "polar-inproc": (f"http://127.0.0.1:{fx_port}/s/{{sid}}/v1/chat/completions", {}, True),
            "bare-proxy": (f"http://127.0.0.1:{bp_port}/v1/chat/completions", {}, False),
        }
        if args.baseline:
            targets["polar-baseline"] = (f"http://127.0.0.1:{bl_port}/s/{{sid}}/v1/chat/completions", {}, True)
        litellm_start_s = None
        if not args.skip_litellm:
            exe = Path(args.litellm_venv) / "bin" / "litellm"
            if not exe.exists():
                raise SystemExit(f"{exe} not found; set up the LiteLLM venv (see this script's docstring) or pass --skip-litellm")
            key = "sk-" + secrets.token_hex(32)
            cfg = tmp / "litellm.yaml"
            cfg.write_text(
                "model_list:\n  - model_name: tiny\n    litellm_params:\n      model: openai/tiny\n"
                f"      api_base: http://127.0.0.1:{up_port}/v1\n      api_key: unused\n")
            procs["litellm"] = start([str(exe), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(ll_port)],
                                     {"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}, tmp / "litellm.log")
            litellm_start_s = wait_http(f"http://127.0.0.1:{ll_port}/health/liveliness", 180)
            targets["litellm"] = (f"http://127.0.0.1:{ll_port}/v1/chat/completions", {"authorization": f"Bearer {key}"}, False)

        results: list[dict[str, Any]] = []
        for rep in range(args.repeats):
            for conc, n in zip(args.concurrency, args.requests, strict=False):
                for name, (url, headers, sessions) in targets.items():
                    pid = procs["upstream" if name == "direct" else name].pid
                    cpu0 = cpu_seconds(pid)
                    r = asyncio.run(load(url, conc, n, args.warmup, args.cap_s, headers, sessions))
                    r.update(target=name, concurrency=conc, repeat=rep, server_cpu_s=cpu_seconds(pid) - cpu0)
                    results.append(r)
                    print(f"rep {rep} c={conc:<3} {name:8s} {r['rps']:8.1f} req/s  p50 {r['p50_ms']:7.2f} ms  "
                          f"p99 {r['p99_ms']:7.2f} ms  errors {r['errors']}", flush=True)
        report(results, args, polar_start_s, litellm_start_s)
        if args.out:
            Path(args.out).write_text(json.dumps({"results": results, "machine": machine()}, indent=1))
    finally:
        for p in procs.values():
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def report(results: list[dict[str, Any]], args: argparse.Namespace, polar_s: float, litellm_s: float | None) -> None:
    print(f"\nmachine: {machine()}")
    print(f"direct path: the stand-in's chat endpoint, --direct-chat {args.direct_chat}")
    print(f"start-up to healthy: polar {polar_s:.1f} s" + (f", litellm {litellm_s:.1f} s" if litellm_s else ""))
    print("\n| concurrency | path | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | CPU ms/req |")
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[tuple[int, str], dict[str, float]] = {}
    for conc in args.concurrency:
        direct = [r for r in results if r["concurrency"] == conc and r["target"] == "direct"]
        for name in ("direct", "polar", "polar-baseline", "polar-inproc", "bare-proxy", "litellm"):
            rows = [r for r in results if r["concurrency"] == conc and r["target"] == name]
            if not rows:
                continue
            added50 = statistics.median(r["p50_ms"] - d["p50_ms"] for r, d in zip(rows, direct, strict=True))
            added99 = statistics.median(r["p99_ms"] - d["p99_ms"] for r, d in zip(rows, direct, strict=True))
            med = {k: statistics.median(r[k] for r in rows) for k in ("rps", "p50_ms", "p99_ms")}
            cpu = statistics.median(1000 * r["server_cpu_s"] / r["requests"] for r in rows)
            summary[(conc, name)] = {"added50": added50, "added99": added99, **med}
            added = "" if name == "direct" else f"{added50:.2f} | {added99:.2f}"
            print(f"| {conc} | {name} | {med['rps']:.0f} | {med['p50_ms']:.2f} | {med['p99_ms']:.2f} | "
                  f"{added or '- | -'} | {cpu:.2f} |")
    if any(k[1] == "litellm" for k in summary):
        print("\n| concurrency | LiteLLM added p50 / polar added p50 | LiteLLM req/s / polar req/s |")
        print("|---|---|---|")
        for conc in args.concurrency:
            p, lt = summary.get((conc, "polar")), summary.get((conc, "litellm"))
            if p and lt:
                ratio = lt["added50"] / p["added50"] if p["added50"] > 0 else float("inf")
                print(f"| {conc} | {ratio:.1f}x | {lt['rps'] / p['rps']:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
