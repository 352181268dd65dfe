"""Where the Ray backend's tax goes, in CPU seconds per env step summed over every process involved (issue 38, item 5).

On a shared box wall-clock ratios measure the load; CPU time much less so. Each cell is a fresh process that
starts a backend exactly as ``benchmarks/ray_scaling.py``'s sampling cell does (CartPole-v1, 16 envs per worker,
32-step fragments, weights republished after every fragment), warms up, then reads ``/proc/<pid>/stat``
(utime + stime + the reaped children's cutime + cstime) of itself and all its descendants before and after a
fixed number of fragments. Processes are grouped by role: the driver, the rollout workers (Ray actors or the
local backend's worker processes), ``raylet``, ``gcs_server``, and every other descendant (Ray's agents and log
monitor, idle pre-started Ray workers, the local backend's forkserver). A last cell, ``ray idle``, starts the same
local cluster with nothing to do and reports its daemons' background CPU per wall second.

After the measured fragments each cell lets the same processes sit idle (Ray: every queued call answered) for
``--idle-s`` and reads their background CPU per wall second (Ray's core-worker timers, the raylet's and the GCS's
heartbeats). Background is per wall second, so on a loaded box it inflates the CPU per env step; "work" is the
total less the background over the cell's wall time, and does not depend on the load. On 2 saturated cores,
throughput ~ (2 - background) / work: the column "2 cores' env steps/s", what an idle box would reach when the
cell keeps both cores busy.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/ray_cpu_split.py [--fragments 600] [--worker-counts 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
ROLES = ("driver", "rollout workers", "raylet", "gcs_server", "other")


# ---------------------------------------------------------------------------------------------- /proc
def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, utime + stime + cutime + cstime in s) of a live process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    ppid = int(fields[1])
    cpu = sum(int(fields[i]) for i in (11, 12, 13, 14)) * TICK_S  # utime stime cutime cstime
    return ppid, cpu


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def snapshot(root: int) -> dict[int, float]:
    """CPU seconds of ``root`` and every live descendant (by parent pid)."""
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = _stat(int(name))
            if s is not None:
                stats[int(name)] = s
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            out[pid] = stats[pid][1]
            todo.extend(children.get(pid, []))
    return out


def role(pid: int, driver: int, workers: set[int]) -> str:
    if pid == driver:
        return "driver"
    if pid in workers:
        return "rollout workers"
    cmd = _cmdline(pid)
    if "raylet" in cmd.split(" ")[0]:
        return "raylet"
    if "gcs_server" in cmd.split(" ")[0]:
        return "gcs_server"
    return "other"


def split(before: dict[int, float], after: dict[int, float], driver: int, workers: set[int]) -> dict[str, float]:
    """CPU seconds per role between two snapshots (a process that exited is counted in its reaper's cutime).

    Call it while the processes still run: roles are read from their command lines."""
    out = dict.fromkeys(ROLES, 0.0)
    for pid in set(before) | set(after):
        r = role(pid, driver, workers)
        out[r] += after.get(pid, 0.0) - before.get(pid, 0.0)
    return out


# ---------------------------------------------------------------------------------------------- children
def child_sample(args: argparse.Namespace) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from ray_scaling import _run_cfg

    from polar.models.policy import build_policy
    from polar.rollout.backends.base import make_backend

    torch.set_num_threads(1)
    cfg = _run_cfg(args.backend, args.workers, args.envs, 0, {"type": "ppo", "kwargs": {"n_steps": args.n_steps}}, 10**9)
    backend = make_backend(cfg, args.n_steps, seed=0)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    backend.start(policy.state_dict(), 0, policy=policy)
    me = os.getpid()
    try:
        if args.backend == "ray":
            import ray

            pool = backend.pool  # type: ignore[attr-defined]
            workers = {ray.get(a.ready.remote())["pid"] for a in pool.actors().values()}
        else:
            workers = {p.pid for p in getattr(backend, "_procs", [])}
        version = 0
        for _ in range(2 * max(1, args.workers) + 8):  # warm-up: every worker has answered
            backend.next_fragment(timeout_s=300)
            version += 1
            backend.publish_weights(policy.state_dict(), version)
        before, t0, load0 = snapshot(me), time.perf_counter(), os.getloadavg()[0]
        steps = 0
        for _ in range(args.fragments):
            steps += backend.next_fragment(timeout_s=300).env_steps
            version += 1
            backend.publish_weights(policy.state_dict(), version)
        after, elapsed, load1 = snapshot(me), time.perf_counter() - t0, os.getloadavg()[0]
        cpu = split(before, after, me, workers)
        # the same processes with nothing to do: what they burn per wall second whatever the load
        if args.backend == "ray":
            ray.wait(list(pool.inflight), num_returns=len(pool.inflight), timeout=300)
        time.sleep(1.0)  # local workers fill their two slots, then block
        before, t0 = snapshot(me), time.perf_counter()
        time.sleep(args.idle_s)
        idle = split(before, snapshot(me), me, workers)
        idle_s = time.perf_counter() - t0
    finally:
        backend.close()
    return {"cell": f"{args.backend} {args.workers}w", "backend": args.backend, "workers": args.workers,
            "env_steps": steps, "wall_s": round(elapsed, 3), "env_steps_per_s": round(steps / elapsed, 1),
            "cpu_s": {k: round(v, 3) for k, v in cpu.items()}, "load": [round(load0, 2), round(load1, 2)],
            "idle_ms_per_s": {k: round(v / idle_s * 1e3, 2) for k, v in idle.items()}}


def child_idle(args: argparse.Namespace) -> dict:
    """A local cluster started as the Ray backend starts it, with nothing to do: its daemons' own CPU."""
    from polar.distributed.cluster import RoleRequest, connect

    handle = connect(None, 60.0, [RoleRequest("rollout", args.workers, 1.0)])
    me = os.getpid()
    try:
        time.sleep(3.0)  # past start-up
        before, t0 = snapshot(me), time.perf_counter()
        time.sleep(args.idle_s)
        after, elapsed = snapshot(me), time.perf_counter() - t0
        cpu = split(before, after, me, set())
    finally:
        handle.shutdown()
    return {"cell": "ray idle", "backend": "ray", "workers": 0, "wall_s": round(elapsed, 3),
            "cpu_s": {k: round(v, 3) for k, v in cpu.items()}, "load": [round(os.getloadavg()[0], 2)]}


# ---------------------------------------------------------------------------------------------- driver
def _spawn(argv: list[str], timeout_s: float) -> dict | None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": str(ROOT)}
    try:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], env=env, capture_output=True,
                             text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print(f"  timed out after {timeout_s:.0f} s: {' '.join(argv)}", file=sys.stderr)
        return None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    print(f"  failed ({out.returncode}): {' '.join(argv)}\n{out.stderr[-1500:]}", file=sys.stderr)
    return None


def _row(r: dict) -> str:
    """Per env step: CPU by role and in all; the idle processes' background over this cell's wall time; the
    rest (per-step work, load-independent); 2 cores' worth of env steps/s with the background at its idle rate."""
    us = {k: v / r["env_steps"] * 1e6 for k, v in r["cpu_s"].items()}
    total = sum(us.values())
    bg_per_s = sum(r["idle_ms_per_s"].values()) / 1e3
    bg = bg_per_s * r["wall_s"] / r["env_steps"] * 1e6
    work = total - bg
    cells = " | ".join(f"{us[k]:.2f}" for k in ROLES)
    return (f"| {r['cell']} | {cells} | **{total:.2f}** | {bg:.2f} | **{work:.2f}** | {bg_per_s * 1e3:.0f} | "
            f"{(2 - bg_per_s) / work * 1e6:,.0f} | {r['env_steps_per_s']:,.0f} | {r['load'][0]:.1f}-{r['load'][-1]:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", choices=["sample", "idle"])
    p.add_argument("--backend", default="ray", choices=["local", "ray"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--n-steps", type=int, default=32)
    p.add_argument("--fragments", type=int, default=600, help="fragments measured per cell, after warm-up")
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--worker-counts", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=1, help="cells per (backend, workers), interleaved")
    p.add_argument("--out", type=Path, default=None, help="append raw results here as JSON lines")
    args = p.parse_args()
    if args.child:
        print(json.dumps(child_sample(args) if args.child == "sample" else child_idle(args)), flush=True)
        return

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    rows: list[dict] = []
    idle = _spawn(["--child", "idle", "--idle-s", str(args.idle_s), "--workers", str(max(args.worker_counts))], 300)
    if idle is not None:
        rows.append(idle)
    idle_per_s = sum(idle["cpu_s"].values()) / idle["wall_s"] if idle else None
    for _ in range(args.repeats):
        for w in args.worker_counts:
            for b in ("local", "ray"):
                r = _spawn(["--child", "sample", "--backend", b, "--workers", str(w), "--envs", str(args.envs),
                            "--n-steps", str(args.n_steps), "--fragments", str(args.fragments)], 600)
                if r is not None:
                    rows.append(r)
    if args.out:
        with args.out.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"\nenvs per worker {args.envs}, fragment {args.n_steps} steps, {args.fragments} fragments per cell\n")
    if idle is not None:
        parts = ", ".join(f"{k} {v / idle['wall_s'] * 1e3:.1f}" for k, v in idle["cpu_s"].items() if v)
        print(f"ray idle: {idle_per_s * 1e3:.1f} ms CPU per wall second ({parts})\n")
    print("| cell | " + " | ".join(ROLES) + " | total (us CPU / env step) | of it background | work (total - "
          "background) | background (ms CPU / s) | 2 cores' env steps/s | measured env steps/s | load |")
    print("|---|" + "---:|" * (len(ROLES) + 7) + "---|")
    for r in rows:
        if r["cell"] != "ray idle":
            print(_row(r))


if __name__ == "__main__":
    main()
