"""``polar generate --config FILE --out DATA.parquet``: collect agent trajectories offline.

Runs the config's harness over its tasks with the configured model, scores every session with the
verifier, and keeps only sessions whose reward reaches ``--min-reward`` (rejection sampling). The
accepted trajectories (token ids, loss masks, logprobs, rewards) are written as Parquet, which
``sft_warmup.demonstrations`` / ``policy: {type: sft}`` read directly.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

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


def generate(cfg: Any, out: str | Path, samples_per_task: int = 4, min_reward: float = 1.0, max_tasks: int = 0,
             tasks_path: str | None = None, engine: Any = None, work_dir: str | Path | None = None) -> dict[str, Any]:
    """Collect, filter, write. Returns counts (also written next to the dataset as ``<out>.json``)."""
    import tempfile

    from polar.errors import ConfigError
    from polar.harness.sessions import load_run_tasks as load_tasks
    from polar.rollout.sessions.session import SessionStatus
    from polar.trainers.build import build_session_stack as build_stack
    from polar.trajectory import write_parquet

    if samples_per_task < 1:
        raise ConfigError("--samples-per-task must be >= 1")
    path = tasks_path or cfg.tasks
    if not path:
        raise ConfigError("no tasks: set 'tasks: FILE.jsonl' in the config or pass --tasks")
    tasks = load_tasks(path, cfg.config_dir)
    if max_tasks:
        tasks = tasks[:max_tasks]
    work = Path(work_dir or tempfile.mkdtemp(prefix="polar-generate-"))
    with build_stack(cfg, work, engine) as stack:
        groups = stack.run_groups([(t, samples_per_task, {"generate": True}) for t in tasks])
    results = [r for g in groups for r in g]
    accepted = [r for r in results if r.status == SessionStatus.DONE and r.reward is not None and r.reward >= min_reward
                and r.trainable]
    samples = [s for r in accepted for s in r.samples if any(s.loss_mask)]
    counts = {
        "tasks": len(tasks), "sessions": len(results), "accepted_sessions": len(accepted), "samples": len(samples),
        "acceptance_rate": len(accepted) / max(1, len(results)), "min_reward": min_reward,
        "status_counts": {s.value: sum(r.status == s for r in results) for s in SessionStatus if s.terminal},
        "builder": cfg.trajectory.builder,
    }
    out = Path(out)
    if samples:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_parquet(samples, out)
    Path(str(out) + ".json").write_text(json.dumps(counts, indent=2))
    return counts


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from polar.config import load_config

    cfg = load_config(args.config, args.override)
    counts = generate(cfg, args.out, args.samples_per_task, args.min_reward, args.max_tasks, args.tasks)
    console = Console(stderr=True)
    console.print(f"accepted {counts['accepted_sessions']}/{counts['sessions']} sessions "
                  f"({counts['acceptance_rate']:.1%}), {counts['samples']} samples")
    if not counts["samples"]:
        console.print(f"[yellow]no session reached reward {args.min_reward}; nothing written to {args.out}[/]")
        return 1
    console.print(f"wrote {args.out}")
    return 0
