"""``polar generate --config FILE --out DATA.parquet``: collect agent trajectories offline.

Runs the config's harness over its tasks with the configured model, scores every session with the
verifier, and keeps only sessions whose reward reaches ``--min-reward`` (rejection sampling). The
accepted trajectories (token ids, loss masks, logprobs, rewards) are written as Parquet, which
``sft_warmup.demonstrations`` / ``policy: {type: sft}`` read directly.

While it runs it logs a progress line at least every ``--progress-every-s`` seconds; at the end it says why
sessions were dropped (timeouts, fully masked, verifier errors, ...; also in ``<out>.json``). Its working
folder (gateway records, finished sessions, workspaces) is ``<out>.work-<time>/`` next to the output,
removed when the command succeeds unless ``--keep-work-dir``, kept (and named) when it fails.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polar.config.run import AgentRunConfig
    from polar.inference.base import Engine

HELP = "collect verified agent trajectories into a dataset (rejection sampling by reward)"

log = logging.getLogger("polar.generate")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="run config YAML (harness, tasks, verifier, model)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY.PATH=VALUE")
    p.add_argument("--out", required=True, help="output Parquet file")
    p.add_argument("--samples-per-task", type=int, default=4, help="sessions per task (default 4)")
    p.add_argument("--min-reward", type=float, default=1.0, help="keep sessions with reward >= this (default 1.0)")
    p.add_argument("--max-tasks", type=int, default=0, help="use only the first N tasks (0 = all)")
    p.add_argument("--tasks", default=None, help="tasks JSONL (default: the config's 'tasks')")
    p.add_argument("--keep-work-dir", action="store_true",
                   help="keep the working folder (<out>.work-<time>/: every model call and session) after success")
    p.add_argument("--progress-every-s", type=float, default=10.0, metavar="S",
                   help="a progress line at least every S seconds while sessions run (default 10)")


def default_work_dir(out: str | Path) -> Path:
    """``<out>.work-<time>`` beside the output: found where the user looks, never in an unnamed temp dir."""
    import time

    out = Path(out)
    return out.parent / f"{out.name}.work-{time.strftime('%Y%m%d-%H%M%S')}"


def _progress_line(done: int, total: int, statuses: dict[str, int], reached: int, t_s: float) -> str:
    by = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    return (f"generate: {done}/{total} sessions finished ({by or 'none yet'}), {reached} reached the reward so far, "
            f"{t_s:.0f}s")


def generate(cfg: AgentRunConfig, out: str | Path, samples_per_task: int = 4, min_reward: float = 1.0, max_tasks: int = 0,
             tasks_path: str | None = None, engine: Engine | None = None, work_dir: str | Path | None = None,
             keep_work_dir: bool = False, progress_every_s: float = 10.0) -> dict[str, Any]:
    """Collect, filter, write. Returns counts (also written next to the dataset as ``<out>.json``), with
    ``dropped`` (sessions per reason, ``polar.rollout.sessions.stats``) and ``work_dir`` (None once removed).
    ``work_dir``: default ``<out>.work-<time>/``; removed after success unless ``keep_work_dir``."""
    import concurrent.futures
    import shutil
    import time

    from polar.errors import ConfigError
    from polar.harness.sessions import load_run_tasks as load_tasks
    from polar.rollout.sessions.session import SessionStatus
    from polar.rollout.sessions.stats import live_counts, summarize_drops
    from polar.trainers.build import build_session_stack as build_stack
    from polar.trainers.preflight import check_before_start
    from polar.trajectory import write_parquet

    if samples_per_task < 1:
        raise ConfigError("--samples-per-task must be >= 1")
    path = tasks_path or cfg.tasks
    if not path:
        raise ConfigError("no tasks: set 'tasks: FILE.jsonl' in the config or pass --tasks")
    if progress_every_s <= 0:
        raise ConfigError(f"--progress-every-s must be > 0 (got {progress_every_s})")
    check_before_start(cfg)  # a mistyped verifier or harness module: before anything starts
    tasks = load_tasks(path, cfg.config_dir)
    if max_tasks:
        tasks = tasks[:max_tasks]
    out = Path(out)
    work = Path(work_dir) if work_dir else default_work_dir(out)
    log.info("generate: %d tasks x %d samples = %d sessions; working folder %s", len(tasks), samples_per_task,
             len(tasks) * samples_per_task, work)
    t0 = time.monotonic()

    try:
        with build_stack(cfg, work, engine) as stack, concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(stack.run_groups, [(t, samples_per_task, {"generate": True}) for t in tasks])
            while True:
                try:
                    groups = future.result(timeout=progress_every_s)
                    break
                except concurrent.futures.TimeoutError:
                    c = live_counts(stack, lambda m: bool(m.get("generate")))
                    if c is None:
                        log.info("generate: sessions running, %.0fs", time.monotonic() - t0)
                        continue
                    # reaching the reward is not yet acceptance (masks are checked at the end): "so far"
                    log.info(_progress_line(c.finished, c.sessions, c.statuses,
                                            sum(r >= min_reward for r in c.rewards), time.monotonic() - t0))
    except BaseException:
        log.error("generate failed; its working folder is kept: %s", work)
        raise
    results = [r for g in groups for r in g]
    accepted = [r for r in results if r.status == SessionStatus.DONE and r.reward is not None and r.reward >= min_reward
                and r.trainable]
    samples = [s for r in accepted for s in r.samples if any(s.loss_mask)]
    counts: dict[str, Any] = {
        "tasks": len(tasks), "sessions": len(results), "accepted_sessions": len(accepted), "samples": len(samples),
        "acceptance_rate": len(accepted) / max(1, len(results)), "min_reward": min_reward,
        "status_counts": {s.value: sum(r.status == s for r in results) for s in SessionStatus if s.terminal},
        "dropped": summarize_drops(results, min_reward).to_dict(),
        "builder": cfg.trajectory.builder, "time_s": round(time.monotonic() - t0, 1),
    }
    if samples:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_parquet(samples, out)
    if keep_work_dir or not samples:  # nothing accepted: the records are what tells why
        counts["work_dir"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
        counts["work_dir"] = None
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(out) + ".json").write_text(json.dumps(counts, indent=2))
    return counts


def main(args: argparse.Namespace) -> int:
    from polar.cli._progress import cli_console
    from polar.config import load_config
    from polar.config.run import AgentRunConfig
    from polar.errors import ConfigError

    cfg = load_config(args.config, args.override)
    if not isinstance(cfg, AgentRunConfig):
        raise ConfigError(f"polar generate: {args.config} is an env run (harness.type: {cfg.harness.type}); generate "
                          "collects agent sessions: give an agent run's config (harness.type: agent, or an env "
                          "harness with the built-in LLM agent policy)")
    counts = generate(cfg, args.out, args.samples_per_task, args.min_reward, args.max_tasks, args.tasks,
                      keep_work_dir=args.keep_work_dir, progress_every_s=args.progress_every_s)
    from polar.rollout.sessions.stats import DROP_HELP

    console = cli_console()
    console.print(f"accepted {counts['accepted_sessions']}/{counts['sessions']} sessions "
                  f"({counts['acceptance_rate']:.1%}), {counts['samples']} samples", markup=False, highlight=False)
    for reason, d in counts["dropped"].items():
        example = f"; e.g. {d['example']}" if d.get("example") else ""
        console.print(f"  dropped {d['sessions']}: {reason} ({DROP_HELP[reason]}){example}", markup=False,
                      highlight=False)
    if counts["work_dir"]:
        console.print(f"working folder kept: {counts['work_dir']} (gateway/sessions: every model call; "
                      "sessions: every finished session)", markup=False, highlight=False)
    if not counts["samples"]:
        console.print(f"[yellow]no session reached reward {args.min_reward}; nothing written to {args.out}[/]")
        return 1
    console.print(f"wrote {args.out}")
    return 0
