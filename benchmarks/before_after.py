"""polar before vs after a change, side by side in one run on the same box (issue 34's "no regression").

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/before_after.py [--before 12f6413] [--after PATH|REF] \
        [--repeats 3] [--json ba.json]
    .venv/bin/python benchmarks/before_after.py --quick --json /tmp/ba.json     # a smoke run, ~2 min

``--before`` is a git ref (default ``12f6413``, the commit the issue-34 refactor started from) or a folder
holding a checkout; a ref gets a temporary ``git worktree`` that is removed at the end. ``--after`` is
this checkout's working tree by default (uncommitted edits included), or a ref / folder like ``--before``.

Every measurement is a fresh subprocess of the same interpreter with ``PYTHONPATH`` set to one side's
tree (checked: ``import polar`` resolves there) and that tree as its working directory. Each side is
driven through its CLI (``python -m polar.cli.main run`` / ``gateway``) on the same config files, this
checkout's, so internal renames between the two sides do not matter and both run the same workload.
Per repeat and per benchmark the two sides alternate order (before, after / after, before), so both
see the same load. Rows (CPU s: user + sys of the whole process tree, from ``os.wait4``: it does not
count waiting for a core, which is what a shared box mostly adds to wall time):

- ``ppo``: ``examples/cartpole_ppo.yaml`` (RL Zoo's CartPole settings, the docs' PPO config; its
  ``stop_reward: 475`` ends the run once the last 100 episodes average 475): CPU s from process start
  to 475, the env steps it took, and whether it got there; seed = repeat index.
- ``dqn``: ``examples/cartpole_dqn.yaml``, 50,000 env steps (``benchmarks/off_policy_vs_sb3.py``'s DQN
  workload): CPU s of the whole run.
- ``sac``: ``examples/pendulum_sac.yaml``, 10,000 env steps (that script's SAC workload): CPU s.
- ``gateway``: ``polar gateway --model vllm:<stand-in>`` in front of the stand-in upstream of
  ``benchmarks/gateway_overhead.py``, closed-loop load at concurrency 1 from that script's load
  generator (1,000 requests after 100 warm-up ones): req/s and p50 ms. One upstream serves both sides.
- ``grpo``: ``benchmarks/configs/tiny_grpo.yaml`` (the default suite's tiny-model GRPO shape, every step
  an update), 8 steps: seconds per GRPO step over steps 2..8 (the first step carries start-up).

Evaluation at the end, TensorBoard and checkpoints are off in every run. The table prints the median
over repeats per side, after / before, and the cost ratio (after / before for seconds, before / after
for req/s): issue 34 asks for <= 1.05 on every row. A full run is about 2 x 3 x (20 + 90 + 200 + 15 + 20)
CPU seconds, ~35 minutes on an idle 2-core box (DQN and SAC are most of it; ``--only`` picks rows). A trial
that fails is reported and the others still run (exit status 1). ``--quick`` runs each measurement tiny (a few
thousand env steps, 2 GRPO steps, 30 gateway requests, one repeat): it checks the machinery, not
the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BEFORE = "12f6413"
BENCHES = ("ppo", "dqn", "sac", "gateway", "grpo")
RUN_OFF = ["logging.tensorboard=false", "logging.checkpoint_freq=0", "eval.at_end=false"]


@dataclass(frozen=True)
class Side:
    """One side of the comparison: its name, the tree polar is imported from, what it was made from."""

    name: str
    tree: Path
    source: str
    commit: str


@dataclass(frozen=True)
class Plan:
    """The sizes of every measurement (full or ``--quick``)."""

    ppo_steps: int | None  # None: the config's budget (100k) with its stop_reward
    dqn_steps: int
    sac_steps: int
    gateway_requests: int
    gateway_warmup: int
    grpo_steps: int
    grpo_overrides: tuple[str, ...]
    timeout_s: float


FULL = Plan(ppo_steps=None, dqn_steps=50_000, sac_steps=10_000, gateway_requests=1000, gateway_warmup=100,
            grpo_steps=8, grpo_overrides=(), timeout_s=3600)
QUICK = Plan(ppo_steps=2048, dqn_steps=1300, sac_steps=200, gateway_requests=30, gateway_warmup=5, grpo_steps=2,
             grpo_overrides=("policy.kwargs.group_size=4", "policy.kwargs.tasks_per_step=2",
                             "policy.kwargs.micro_batch_size=8"), timeout_s=600)


# ---------------------------------------------------------------------------------------------- sides
def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def make_side(name: str, spec: str | None, scratch: Path, worktrees: list[Path]) -> Side:
    """``spec``: None (this working tree), a folder (used as it is) or a git ref (a temporary worktree)."""
    if spec is None:
        return Side(name, ROOT, "working tree", _git("rev-parse", "HEAD") + "+working-tree")
    if Path(spec).is_dir():
        tree = Path(spec).resolve()
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        return Side(name, tree, f"folder {tree}", commit.strip() or "unknown")
    try:
        commit = _git("rev-parse", "--verify", f"{spec}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--{name} {spec!r}: neither a folder nor a git ref of {ROOT} "
                         "(give a commit, a branch, or a folder with a checkout)") from None
    tree = scratch / name
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), commit],
                   check=True, capture_output=True, text=True)
    worktrees.append(tree)
    return Side(name, tree, f"ref {spec}", commit)


def side_env(side: Side) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(side.tree), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def check_side(side: Side) -> None:
    """``import polar`` must resolve inside the side's tree, or the comparison compares nothing."""
    p = subprocess.run([sys.executable, "-c", "import polar; print(polar.__file__)"], capture_output=True, text=True,
                       env=side_env(side), cwd=side.tree, timeout=120)
    if p.returncode != 0 or not p.stdout.strip().startswith(str(side.tree)):
        raise SystemExit(f"{side.name}: import polar resolves to {p.stdout.strip() or p.stderr.strip()[-300:]!r}, "
                         f"not under {side.tree}")


# ---------------------------------------------------------------------------------------------- processes
def run_cli(side: Side, args: list[str], log: Path, timeout_s: float) -> tuple[float, float]:
    """``python -m polar.cli.main ARGS`` in the side's tree; returns (CPU s of the process tree, wall s)."""
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "polar.cli.main", *args], cwd=side.tree, env=side_env(side),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                raise RuntimeError(f"{side.name}: polar {' '.join(args[:3])} ran past {timeout_s:.0f} s; log: {log}")
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-2500:]
        raise RuntimeError(f"{side.name}: polar {' '.join(args[:3])} exited {proc.returncode}:\n{tail}")
    return usage.ru_utime + usage.ru_stime, wall


def metrics_rows(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise RuntimeError(f"{path} is missing: the run wrote no metrics")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _config(rel: str) -> str:
    return str(ROOT / rel)  # this checkout's config, the same file for both sides


# ---------------------------------------------------------------------------------------------- benchmarks
def bench_ppo(side: Side, seed: int, plan: Plan, work: Path) -> dict[str, float]:
    run_dir = work / "run"
    args = ["run", "--config", _config("examples/cartpole_ppo.yaml"), "--run-dir", str(run_dir), "--no-progress",
            "-o", f"seed={seed}", *[a for o in RUN_OFF for a in ("-o", o)]]
    if plan.ppo_steps is not None:
        args += ["-o", f"total_env_steps={plan.ppo_steps}"]
    cpu, wall = run_cli(side, args, work / "ppo.log", plan.timeout_s)
    last = metrics_rows(run_dir)[-1]
    reached = last.get("episodes", 0) >= 100 and (last.get("episode_reward_mean") or 0) >= 475
    return {"ppo_cpu_s_to_475": cpu, "ppo_wall_s_to_475": wall, "ppo_env_steps": float(last["env_steps"]),
            "ppo_reached_475": float(reached)}


def _off_policy(algo: str, config: str) -> Callable[[Side, int, Plan, Path], dict[str, float]]:
    def bench(side: Side, seed: int, plan: Plan, work: Path) -> dict[str, float]:
        run_dir = work / "run"
        n: int = getattr(plan, f"{algo}_steps")
        cpu, wall = run_cli(side, ["run", "--config", _config(config), "--run-dir", str(run_dir), "--no-progress",
                                   "-o", f"seed={seed}", "-o", f"total_env_steps={n}",
                                   *[a for o in RUN_OFF for a in ("-o", o)]], work / f"{algo}.log", plan.timeout_s)
        last = metrics_rows(run_dir)[-1]
        return {f"{algo}_cpu_s": cpu, f"{algo}_wall_s": wall, f"{algo}_env_steps": float(last["env_steps"])}
    return bench


def _gateway_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gateway_overhead", ROOT / "benchmarks" / "gateway_overhead.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Upstream:
    """The stand-in vLLM upstream of ``gateway_overhead.py`` (this checkout's), shared by both sides."""

    def __init__(self, work: Path) -> None:
        self.gw = _gateway_module()
        self.port = self.gw.free_port()
        env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.proc = self.gw.start([sys.executable, str(ROOT / "benchmarks" / "gateway_overhead.py"),
                                   "--serve-upstream", str(self.port)], env, work / "upstream.log")
        self.gw.wait_http(f"http://127.0.0.1:{self.port}/health", 120)

    def close(self) -> None:
        self.gw.stop(self.proc)


def bench_gateway(side: Side, seed: int, plan: Plan, work: Path, upstream: Upstream) -> dict[str, float]:
    gw = upstream.gw
    port = gw.free_port()
    log = work / "gateway.log"
    with log.open("w") as out:  # cwd = the side's tree: `python -m` puts the cwd first on sys.path
        proc = subprocess.Popen([sys.executable, "-m", "polar.cli.main", "gateway", "--model",
                                 f"vllm:http://127.0.0.1:{upstream.port}", "--port", str(port), "--records-dir",
                                 str(work / "records")], cwd=side.tree, env=side_env(side), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            gw.wait_http(f"http://127.0.0.1:{port}/health", 180)
        except RuntimeError:
            raise RuntimeError(f"{side.name}: polar gateway did not come up:\n"
                               f"{log.read_text(errors='replace')[-2000:]}") from None
        r = asyncio.run(gw.load(f"http://127.0.0.1:{port}/s/{{sid}}/v1/chat/completions", 1, plan.gateway_requests,
                                plan.gateway_warmup, 60.0, {}, True))
    finally:
        gw.stop(proc)
    if r["errors"]:
        raise RuntimeError(f"{side.name}: {r['errors']} gateway requests failed; log: {log}")
    return {"gateway_rps_c1": r["rps"], "gateway_p50_ms_c1": r["p50_ms"]}


def bench_grpo(side: Side, seed: int, plan: Plan, work: Path) -> dict[str, float]:
    run_dir = work / "run"
    args = ["run", "--config", _config("benchmarks/configs/tiny_grpo.yaml"), "--run-dir", str(run_dir),
            "--no-progress", "-o", f"seed={seed}", "-o", f"policy.kwargs.total_steps={plan.grpo_steps}",
            *[a for o in plan.grpo_overrides for a in ("-o", o)]]
    cpu, _ = run_cli(side, args, work / "grpo.log", plan.timeout_s)
    rows = [r for r in metrics_rows(run_dir) if "reward_mean" in r and "time_s" in r]
    if len(rows) < 2:
        raise RuntimeError(f"{side.name}: {len(rows)} GRPO step rows with time_s in {run_dir / 'metrics.jsonl'}")
    step_s = (rows[-1]["time_s"] - rows[0]["time_s"]) / (len(rows) - 1)
    return {"grpo_s_per_step": step_s, "grpo_cpu_s": cpu,
            "grpo_updates": float(sum(not r.get("update_skipped", 0) for r in rows))}


# ---------------------------------------------------------------------------------------------- report
LOWER_IS_BETTER = ("cpu_s", "wall_s", "p50_ms", "s_per_step")
HEADLINE = ("ppo_cpu_s_to_475", "dqn_cpu_s", "sac_cpu_s", "gateway_rps_c1", "grpo_s_per_step")
BAR = 1.05


def summarise(trials: list[dict[str, float | int | str]]) -> list[dict[str, float | str | None]]:
    keys: list[str] = []
    for t in trials:
        keys += [k for k, v in t.items() if isinstance(v, float) and k != "load" and k not in keys]
    rows: list[dict[str, float | str | None]] = []
    for k in keys:
        vals = {s: [float(t[k]) for t in trials if t["side"] == s and isinstance(t.get(k), float)]
                for s in ("before", "after")}
        if not vals["before"] or not vals["after"]:
            continue
        b, a = statistics.median(vals["before"]), statistics.median(vals["after"])
        lower = any(s in k for s in LOWER_IS_BETTER)
        higher = "rps" in k
        ratio = a / b if b else None
        cost = (a / b if lower else b / a) if (lower or higher) and a and b else None
        rows.append({"metric": k, "before": b, "after": a, "after_over_before": ratio, "cost_ratio": cost,
                     "better": "lower" if lower else "higher" if higher else "-",
                     "headline": "yes" if k in HEADLINE else "no"})
    return rows


def table(rows: list[dict[str, float | str | None]], n: int, loads: list[float]) -> str:
    def f(x: float | str | None, spec: str) -> str:
        return "-" if x is None else format(x, spec) if isinstance(x, float) else str(x)

    lines = [f"polar after / before: median of {n} interleaved repeat(s) per side; load average "
             f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f} on {os.cpu_count()} CPUs",
             "", "| metric | before | after | after / before | cost ratio (<= 1.05) | better |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        flag = " **over**" if isinstance(r["cost_ratio"], float) and r["cost_ratio"] > BAR else ""
        name = f"**{r['metric']}**" if r["headline"] == "yes" else str(r["metric"])
        lines.append(f"| {name} | {f(r['before'], '.4g')} | {f(r['after'], '.4g')} | "
                     f"{f(r['after_over_before'], '.3f')} | {f(r['cost_ratio'], '.3f')}{flag} | {r['better']} |")
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()}"


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=DEFAULT_BEFORE, help=f"git ref or folder (default {DEFAULT_BEFORE})")
    ap.add_argument("--after", default=None, help="git ref or folder (default: this working tree)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats per side (default 3; --quick 1)")
    ap.add_argument("--only", nargs="+", choices=BENCHES, default=list(BENCHES))
    ap.add_argument("--quick", action="store_true", help="tiny versions of every measurement (a smoke test)")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT", help="write every trial and the table here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (run dirs and logs)")
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if repeats < 1:
        ap.error("--repeats must be >= 1")

    scratch = Path(tempfile.mkdtemp(prefix="polar-before-after-"))
    worktrees: list[Path] = []
    upstream: Upstream | None = None
    trials: list[dict[str, float | int | str]] = []
    failures: list[str] = []
    loads: list[float] = []
    try:
        sides = {"before": make_side("before", args.before, scratch, worktrees),
                 "after": make_side("after", args.after, scratch, worktrees)}
        for side in sides.values():
            check_side(side)
            print(f"{side.name}: {side.source} ({side.commit[:12]}) at {side.tree}", file=sys.stderr, flush=True)
        if "gateway" in args.only:
            upstream = Upstream(scratch)
        benches: dict[str, Callable[[Side, int, Plan, Path], dict[str, float]]] = {
            "ppo": bench_ppo, "dqn": _off_policy("dqn", "examples/cartpole_dqn.yaml"),
            "sac": _off_policy("sac", "examples/pendulum_sac.yaml"), "grpo": bench_grpo}
        if upstream is not None:
            up = upstream
            benches["gateway"] = lambda s, seed, p, w: bench_gateway(s, seed, p, w, up)
        for rep in range(repeats):
            for i, name in enumerate(args.only):
                order = ("before", "after") if (rep + i) % 2 == 0 else ("after", "before")
                for side_name in order:
                    side = sides[side_name]
                    work = scratch / f"r{rep}-{name}-{side_name}"
                    work.mkdir()
                    t = time.time()
                    try:
                        res = benches[name](side, rep, plan, work)
                    except Exception as e:  # one failed trial is reported; the others still run
                        failures.append(f"rep {rep} {name} {side_name}: {str(e)[-1500:]}")
                        print(f"FAILED {failures[-1]}", file=sys.stderr, flush=True)
                        continue
                    loads.append(os.getloadavg()[0])
                    trials.append({"rep": rep, "bench": name, "side": side_name, "load": loads[-1], **res})
                    print(f"rep {rep} {name:8s} {side_name:6s} ({time.time() - t:.0f} s, load {loads[-1]:.1f}): "
                          + ", ".join(f"{k} {v:.4g}" for k, v in res.items()), file=sys.stderr, flush=True)
        rows = summarise(trials)
        print(table(rows, repeats, loads))
        if args.json:
            args.json.write_text(json.dumps({
                "sides": {k: {"source": s.source, "commit": s.commit, "tree": str(s.tree)} for k, s in sides.items()},
                "repeats": repeats, "quick": args.quick, "machine": machine(), "trials": trials, "summary": rows,
                "failures": failures,
            }, indent=1))
        if failures:
            print(f"\n{len(failures)} trial(s) failed (above, and in the JSON's 'failures'); their rows are missing "
                  "or rest on fewer repeats", file=sys.stderr)
    finally:
        if upstream:
            upstream.close()
        for tree in worktrees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        if args.keep:
            print(f"scratch kept: {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
