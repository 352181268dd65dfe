"""``polar ratings export RUN_DIR --out FILE [--format jsonl|parquet]``: human ratings as a preference dataset.

Ratings are made in ``polar dashboard`` and kept in ``RUN/ratings.jsonl``. The export pairs, within each
task, every two rated sessions (or episodes) whose scores differ: the higher-scored one is ``chosen``."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "export a run's human ratings as a preference dataset (chosen vs rejected per task)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    e = sub.add_parser("export", help="write chosen/rejected pairs to a JSONL or Parquet file")
    e.add_argument("run_dir", help="the run directory whose ratings.jsonl to export")
    e.add_argument("--out", required=True, help="output file")
    e.add_argument("--format", choices=("jsonl", "parquet"), default=None,
                   help="file format (default: from the --out suffix, else jsonl)")


def main(args: argparse.Namespace) -> int:
    from polar.cli._progress import cli_console
    from polar.dashboard import ratings
    from polar.errors import RunDirError
    from polar.trainers.run_dir import RunDir

    run = RunDir.open(args.run_dir)
    out = Path(args.out)
    fmt = args.format or ("parquet" if out.suffix == ".parquet" else "jsonl")
    rows, skipped = ratings.read(run.path)
    if not rows:
        raise RunDirError(f"{run.path} has no ratings ({run.path / 'ratings.jsonl'} is missing or empty); rate "
                          "sessions or episodes in `polar dashboard` first")
    n = ratings.export(run.path, out, fmt)
    console = cli_console()
    if skipped:
        console.print(f"skipped {skipped} unreadable lines of {run.path / 'ratings.jsonl'}")
    console.print(f"{n} preference pairs from {len(ratings.latest(rows))} rated items written to {out} ({fmt})")
    return 0
