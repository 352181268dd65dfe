"""Load test of ``polar serve`` on loopback: onnxruntime and torch backends at concurrency 1, 16 and 64.

For each backend it exports a CartPole PPO policy (64-64 MLP, observation normalisation on) as ONNX or
TorchScript, starts ``polar serve`` as its own process, and runs a bounded closed-loop load of OIP v2
``/infer`` requests (one observation each) for ``--duration-s`` per concurrency level. Halfway through every
level a new export version is moved into the watched directory: the server must pick it up (rolling reload)
with zero failed requests. It prints p50/p99 latency and requests/s, the versions answered, and failures; and,
as the floor HTTP adds to, one in-process call of each runtime on the same graph.

    .venv/bin/python benchmarks/serve_load.py [--duration-s 4] [--json out.json]

The policy is built from its config (its weights do not change the cost of a call); the client runs on the
same machine as the server, so on a small box they share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
CONCURRENCY = (1, 16, 64)


def make_run(root: Path, checkpoints: int):
    """A run directory as the trainer writes it, with ``checkpoints`` checkpoints of different weights."""
    import torch

    from polar.config import RunConfig, validate
    from polar.config.loader import dump_config
    from polar.harness import make_vector_env
    from polar.models.policy import build_policy
    from polar.trainers.checkpoint import CheckpointManager
    from polar.trainers.run_dir import RunDir

    cfg = validate(RunConfig, {"name": "cartpole", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
                               "policy": {"type": "ppo", "kwargs": {"normalize_obs": True}},
                               "logging": {"tensorboard": False, "progress_bar": False}})
    run = RunDir.create(cfg.name, root / "run")
    run.write_config(dump_config(cfg))
    env = make_vector_env(cfg.harness, 1, seed=0)
    spaces = env.single_observation_space, env.single_action_space
    env.close()
    manager = CheckpointManager(run.checkpoints_dir, keep=checkpoints)
    for it in range(1, checkpoints + 1):
        torch.manual_seed(it)
        policy = build_policy(cfg, *spaces)
        policy.obs_norm.norm.update(np.full(4, 0.1), np.full(4, 2.0), 1000)
        manager.save(it, {"policy": policy.state_dict(), "iteration": it, "env_steps": it, "policy_version": it})
    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(repo: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "polar.cli.main", "serve", str(repo), "--port", str(port),
                             "--poll-s", "0.2", "--max-versions", "2", "--trust-code"],  # TorchScript: our own
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"polar serve exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("polar serve did not become ready within 120 s")


async def load(url: str, concurrency: int, duration_s: float, swap) -> dict:
    """Closed loop: ``concurrency`` clients send one request after another for ``duration_s``; ``swap()`` runs
    at half time (the rolling reload)."""
    obs = np.random.default_rng(0).normal(size=(512, 4)).astype(np.float32).round(4).tolist()
    latencies: list[float] = []
    failures: list[str] = []
    versions: list[str] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        end = time.perf_counter() + duration_s

        async def worker(i: int) -> None:
            n = 0
            while time.perf_counter() < end:
                body = {"inputs": [{"name": "obs", "shape": [1, 4], "datatype": "FP32", "data": obs[(i + n) % 512]}]}
                n += 1
                t0 = time.perf_counter()
                try:
                    r = await client.post("/v2/models/cartpole/infer", json=body)
                except httpx.HTTPError as e:
                    failures.append(repr(e))
                    continue
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")
                else:
                    versions.append(r.json()["model_version"])

        async def reload() -> None:
            await asyncio.sleep(duration_s / 2)
            await asyncio.to_thread(swap)

        t0 = time.perf_counter()
        await asyncio.gather(reload(), *(worker(i) for i in range(concurrency)))
        wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1000
    seen = list(dict.fromkeys(versions))
    return {"concurrency": concurrency, "requests": len(latencies), "rps": len(latencies) / wall,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "failures": len(failures), "first_failures": failures[:3], "versions": seen}


def server_time(url: str) -> tuple[float, float]:
    """(sum of seconds, count) the server spent in /infer handlers, from its /metrics."""
    total = count = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith('polar_serve_request_seconds_sum{endpoint="infer"}'):
            total = float(line.split()[-1])
        elif line.startswith('polar_serve_request_seconds_count{endpoint="infer"}'):
            count = float(line.split()[-1])
    return total, count


def in_process_floor(export_onnx: Path, export_ts: Path) -> dict:
    """One call of each runtime on one observation, in process (what HTTP and batching add to)."""
    from polar.deploy.runtime import load_export, zeros_feeds

    out = {}
    for name, d in (("onnxruntime", export_onnx), ("torch", export_ts)):
        runner, _ = load_export(d)
        feeds = zeros_feeds(runner.spec, 1)
        feeds["obs"][:] = 0.1
        for _ in range(200):
            runner.run(feeds)
        ts = []
        for _ in range(2000):
            t0 = time.perf_counter()
            runner.run(feeds)
            ts.append(time.perf_counter() - t0)
        out[name] = {"p50_us": float(np.percentile(ts, 50) * 1e6), "p99_us": float(np.percentile(ts, 99) * 1e6)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=4.0, help="load per concurrency level (bounded)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    from polar.deploy.export import export_run

    root = Path(tempfile.mkdtemp(prefix="polar-serve-load-"))
    levels = len(CONCURRENCY)
    run = make_run(root, levels + 1)
    results: dict = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.python_version()}",
                     "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:]), "backends": {}}
    exports = {}
    for backend, fmt in (("onnxruntime", "onnx"), ("torch", "torchscript")):
        repo = root / f"repo-{fmt}" / "cartpole"  # the model repository layout: <name>/<version>/
        export_run(run.path, repo / "1", fmt, checkpoint=1, samples=1000)
        staged = []
        for it in range(2, levels + 2):  # the versions each level's rolling reload brings in
            export_run(run.path, root / f".staged-{fmt}-{it}", fmt, checkpoint=it, samples=200)
            staged.append((root / f".staged-{fmt}-{it}", repo / str(it)))
        exports[backend] = repo / "1"
        port = free_port()
        proc = start_server(repo, port)
        rows = []
        try:
            url = f"http://127.0.0.1:{port}"
            for c, (src, dst) in zip(CONCURRENCY, staged, strict=True):
                t0, n0 = server_time(url)
                row = asyncio.run(load(url, c, args.duration_s, lambda s=src, d=dst: os.rename(s, d)))
                t1, n1 = server_time(url)
                row["server_ms_mean"] = 1000 * (t1 - t0) / max(1.0, n1 - n0)  # inside the handler, queueing included
                rows.append(row)
                print(f"{backend:12s} c={c:3d}  {row['rps']:8.0f} req/s  p50 {row['p50_ms']:6.2f} ms  "
                      f"p99 {row['p99_ms']:7.2f} ms  in server {row['server_ms_mean']:6.2f} ms  "
                      f"failures {row['failures']}  versions {'->'.join(row['versions'])}", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
        results["backends"][backend] = rows
    results["in_process_call"] = in_process_floor(exports["onnxruntime"], exports["torch"])
    for name, r in results["in_process_call"].items():
        print(f"in-process {name:12s} one call: p50 {r['p50_us']:.1f} us  p99 {r['p99_us']:.1f} us")
    total_failures = sum(r["failures"] for rows in results["backends"].values() for r in rows)
    reloads_seen = all(len(r["versions"]) >= 2 for rows in results["backends"].values() for r in rows)
    print(f"failed requests: {total_failures}; every level answered from two versions (rolling reload): {reloads_seen}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if total_failures == 0 and reloads_seen else 1


if __name__ == "__main__":
    sys.exit(main())
