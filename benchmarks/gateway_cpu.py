"""The gateway's own CPU per model call at c = 1, independent of the machine's load: the gateway app driven
through its ASGI entry (no HTTP server, no client), one call at a time, CPU time per call
(``time.process_time``). Wall-clock latency on a shared box mixes in every other process; CPU per call does
not (much), and the instruction count (``--handshake`` under callgrind, below) not at all.

    .venv/bin/python benchmarks/gateway_cpu.py [--upstream] [--calls 2000] [--repeats 3] [--baseline TREE]

- default engine: a zero-cost in-process engine (16 fixed ids, the tiny tokenizer): parsing, the chat
  template, tokenizing, detokenizing, the response and the record;
- ``--upstream``: ``vllm:<the stand-in>`` as ``polar gateway --model vllm:URL`` runs it (the stand-in
  upstream of ``benchmarks/gateway_overhead.py`` in its own process): adds the upstream client's work;
- ``--baseline TREE``: the same in a gateway from another source tree (a ``git worktree`` of an older
  commit), old and new alternating ``--rounds`` times, each in a fresh process.

Every call is distinct (a counter in the user message) and goes to one session (``/s/bench-0/``), with
records on, as in ``gateway_overhead.py``. Instruction count per call, exactly repeatable on any load:

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=cg.out \\
        .venv/bin/python benchmarks/gateway_cpu.py --child --handshake DIR --calls 300 --repeats 1 &
    # when DIR/ready appears: callgrind_control -i on <pid>; touch DIR/go
    # when DIR/done appears:  callgrind_control -i off <pid>; touch DIR/go2   (then: totals in cg.out / calls)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks/ is not a package: its sibling's request body and helpers

from gateway_overhead import BODY  # noqa: E402  (the same call gateway_overhead.py measures)


def child(args: argparse.Namespace) -> None:
    """Build the gateway app of this interpreter's ``polar`` and print CPU us per call for each repeat."""
    from polar.config.gateway import GatewayConfig
    from polar.gateway.server import build_app, new_event_loop

    records = tempfile.mkdtemp(prefix="gw-cpu-")
    if args.upstream_port:
        app = build_app(GatewayConfig(model=f"vllm:http://127.0.0.1:{args.upstream_port}"), records_dir=records)
    else:
        from polar.inference.tiny import build_tiny_tokenizer
        from polar.testing.standin import FixedEngine

        engine = FixedEngine(n_tokens=16)
        engine.tokenizer, engine.model_name, engine.default_stop_token_ids = build_tiny_tokenizer(), "tiny", []
        app = build_app(GatewayConfig(), engine=engine, records_dir=records)
    head, tail = json.dumps(BODY).encode().split(b"one short sentence.", 1)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)

    async def one(i: int, tag: str) -> None:
        body = b"%sone short sentence. (request %d %s)%s" % (head, i, tag.encode(), tail)
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "scheme": "http", "method": "POST",
            "root_path": "", "path": "/s/bench-0/v1/chat/completions", "raw_path": b"/s/bench-0/v1/chat/completions",
            "query_string": b"", "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                                             (b"content-length", str(len(body)).encode())],
        }
        delivered = False
        never: asyncio.Future[None] = loop.create_future()  # the client stays connected

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never
            return {"type": "http.disconnect"}

        status = 0

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app.asgi(scope, receive, send)
        if status != 200:
            raise SystemExit(f"the gateway answered {status}")

    async def block(n: int, tag: str) -> float:
        c0 = time.process_time()
        for i in range(n):
            await one(i, tag)
            await asyncio.sleep(0)  # a loop turn: whatever the call left for later (its record) runs
        return 1e6 * (time.process_time() - c0) / n

    def handshake(mine: str, theirs: str) -> None:
        if args.handshake:
            Path(args.handshake, mine).touch()
            while not Path(args.handshake, theirs).exists():
                time.sleep(0.05)

    loop.run_until_complete(block(args.warmup, "warm"))
    gc.collect()
    handshake("ready", "go")
    per_call = [loop.run_until_complete(block(args.calls, f"r{r}")) for r in range(args.repeats)]
    handshake("done", "go2")
    print(json.dumps({"cpu_us_per_call": per_call}), flush=True)
    app.store.close()


def run_tree(tree: Path, args: argparse.Namespace, upstream_port: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, __file__, "--child", "--calls", str(args.calls), "--repeats", str(args.repeats),
           "--warmup", str(args.warmup), "--upstream-port", str(upstream_port)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{tree}: the run failed:\n{out.stderr[-2000:]}")
    return list(json.loads(lines[-1])["cpu_us_per_call"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--upstream-port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--handshake", default=None, metavar="DIR", help="pause before and after the measured calls "
                    "(files DIR/ready, DIR/go, DIR/done, DIR/go2), to count instructions under callgrind")
    ap.add_argument("--upstream", action="store_true", help="vllm:<the stand-in upstream> instead of the zero-cost engine")
    ap.add_argument("--calls", type=int, default=2000, help="per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="per process")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3, help="processes per tree (trees alternate)")
    ap.add_argument("--baseline", default=None, metavar="TREE", help="also measure the gateway of this source tree")
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    from polar.inference._http1 import free_port

    trees = [("polar", ROOT)] + ([("baseline", Path(args.baseline).resolve())] if args.baseline else [])
    upstream = None
    port = 0
    if args.upstream:  # the stand-in vLLM of gateway_overhead.py
        from gateway_overhead import wait_http

        port = free_port()
        upstream = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "gateway_overhead.py"),
                                     "--serve-upstream", str(port)], start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{port}/health", 60)
    results: dict[str, list[float]] = {name: [] for name, _ in trees}
    try:
        for r in range(args.rounds):
            for name, tree in trees:
                got = run_tree(tree, args, port)
                results[name] += got
                print(f"round {r} {name:8s} CPU us/call: " + " ".join(f"{x:.0f}" for x in got)
                      + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        if upstream is not None:
            os.killpg(upstream.pid, signal.SIGTERM)
            upstream.wait(10)
    print("\n| gateway | CPU us per call, min | median | repeats |\n|---|---:|---:|---:|")
    for name, values in results.items():
        print(f"| {name} | {min(values):.0f} | {statistics.median(values):.0f} | {len(values)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
