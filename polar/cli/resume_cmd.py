"""``polar resume RUN_DIR [-o key.path=value ...]``: continue a run from its last checkpoint, with its resolved config.

Overrides change the resolved config for the rest of the run (``-o total_env_steps=N`` trains longer,
``-o distribution.rollout_workers=N`` resizes a local run); they are validated like ``polar run -o`` and
written to ``config.resolved.yaml``, so a later resume keeps them.

Every kind of run resumes through the same loop and dispatch as ``polar run`` (``polar.trainers.build``): a
Ray run starts a learner actor that loads the checkpoint (``polar.trainers.ray_driver``); an agent run reloads
its LLM weights and optimizer, skips the SFT warm-up and continues its GRPO steps.
"""

from __future__ import annotations

import argparse
import logging

HELP = "continue a run from its last checkpoint"

log = logging.getLogger("polar.resume")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a directory `polar run` created")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="change a config value for the rest of the run, e.g. -o total_env_steps=200000 (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    p.add_argument("--log-every-s", type=float, default=30.0, metavar="S",
                   help="without a progress bar (no terminal, --no-progress): a progress log line every S seconds")


def _check_not_running(run_dir) -> None:
    """Refuse a run whose owner process still works on it (two writers would interleave); say so when it was killed."""
    from polar.cli._progress import cli_console
    from polar.errors import RunDirError
    from polar.trainers.run_dir import LIVE_STATUSES, owner_alive, run_status, status_line

    st = run_status(run_dir.path)
    if st["status"] in LIVE_STATUSES and st["pid"] is not None:
        alive = owner_alive(run_dir.read_meta().get("process"))
        where = f"pid {st['pid']} on {st['host']}"
        if alive:
            raise RunDirError(f"{run_dir.path} is still {st['status']} ({where}); stop it first (Ctrl-C, or "
                              f"kill -TERM {st['pid']}: it writes a final checkpoint), then resume")
        raise RunDirError(f"{run_dir.path} is recorded {st['status']} by {where}, which this host cannot check; stop "
                          "it there first, or set its run.json status to \"killed\" if that process is gone")
    cli_console().print(status_line(run_dir.path), markup=False, highlight=False)


def main(args: argparse.Namespace) -> int:
    from polar.cli.run_cmd import train
    from polar.trainers.loading import load_run

    run_dir, cfg = load_run(args.run_dir, args.override)
    _check_not_running(run_dir)
    if args.override:
        from polar.config import dump_config
        from polar.config.secrets import redact_override

        run_dir.write_config(dump_config(cfg))
        # the log lands in the run folder: a secret given as an override is not repeated there
        log.info("resume overrides written to %s: %s", run_dir.config_path,
                 " ".join(redact_override(o) for o in args.override))
    return train(cfg, run_dir, resume=True, progress=not args.no_progress, log_every_s=args.log_every_s)
