"""``polar scale RUN_DIR --rollout-workers N``: resize a running Ray run's rollout workers.

A request wins over the ``distribution.autoscale`` rule: the count applies even outside the rule's
range, and the rule stays off for the rest of that run (docs/distributed.md, "Autoscaling").
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from polar.cli._progress import cli_console
from polar.errors import RunDirError

HELP = "add or remove rollout workers of a running run (ray backend)"
console = cli_console()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="the run directory of a running `polar run`")
    parser.add_argument("--rollout-workers", type=int, required=True, help="the new number of rollout workers")
    parser.add_argument("--wait-s", type=float, default=0.0, help="wait this long for the run to confirm (0 = don't wait)")


def _backend(run_dir: Path) -> str | None:
    import yaml

    p = run_dir / "config.resolved.yaml"
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    return (data.get("distribution") or {}).get("backend", "local")


def main(args: argparse.Namespace) -> int:
    from polar.distributed.control import read_applied, request_scale

    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory. Pass the directory `polar run` printed at start.")
    backend = _backend(run_dir)
    if backend is None:
        raise RunDirError(f"{run_dir}: no config.resolved.yaml here; is this a polar run directory?")
    if backend != "ray":
        raise RunDirError(
            f"{run_dir}: distribution.backend is {backend!r}; only the ray backend resizes while running. Stop the "
            f"run and continue it with `polar resume {run_dir} -o distribution.rollout_workers={args.rollout_workers}`"
        )
    req = request_scale(run_dir, args.rollout_workers)
    console.print(f"asked {run_dir} for {args.rollout_workers} rollout workers")
    if args.wait_s > 0:
        deadline = time.monotonic() + args.wait_s
        while time.monotonic() < deadline:
            applied = read_applied(run_dir)
            if applied and applied.get("applied_at", 0) >= req["requested_at"]:
                console.print(f"the run now has {applied['rollout_workers']} rollout workers")
                return 0
            time.sleep(0.2)
        console.print(f"[yellow]the run did not confirm within {args.wait_s:g} s (is it running?)[/]")
        return 1
    return 0
