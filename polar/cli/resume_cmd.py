"""``polar resume RUN_DIR``: continue a run from its last checkpoint, with its resolved config.

A Ray run resumes the same way ``polar run`` starts one: this process starts a learner actor that
loads the checkpoint (``polar.distributed.learner_actor``).
"""

from __future__ import annotations

import argparse

HELP = "continue a run from its last checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a directory `polar run` created")
    p.add_argument("--no-progress", action="store_true")


def main(args: argparse.Namespace) -> int:
    from polar.cli.run_cmd import train
    from polar.trainers.loading import load_run

    run_dir, cfg = load_run(args.run_dir)
    if cfg.harness.type == "agent":  # GRPO/SFT on an agent harness: continue from its last checkpoint
        from polar.trainers.agentic_run import train_agentic

        train_agentic(cfg, run_dir, resume=True)
        return 0
    return train(cfg, run_dir, resume=True, progress=not args.no_progress)
