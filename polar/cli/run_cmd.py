"""``polar run --config FILE [-o key.path=value ...] [--run-dir DIR]``: train from one YAML file."""

from __future__ import annotations

import argparse
import logging

HELP = "train from a YAML run config"

log = logging.getLogger("polar.run")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="run config YAML")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value, e.g. -o policy.kwargs.learning_rate=1e-3 (repeatable)")
    p.add_argument("--run-dir", default=None, help="write the run here instead of runs/<name>-<timestamp>/")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    p.add_argument("--log-every-s", type=float, default=30.0, metavar="S",
                   help="without a progress bar (no terminal, --no-progress): a progress log line every S seconds")


def main(args: argparse.Namespace) -> int:
    from polar.config import load_config
    from polar.trainers.preflight import check_before_start
    from polar.trainers.run_dir import RunDir

    cfg = load_config(args.config, args.override)  # validates everything before anything starts
    check_before_start(cfg)  # unknown ids, missing programs and modules: before the run directory exists
    if cfg.harness.type == "agent" or cfg.policy.type in ("grpo", "sft"):  # LLM agents: polar.trainers.agentic_run
        from polar.trainers.agentic_run import run_from_cli

        return run_from_cli(cfg, args)
    from polar.config.policy import OFF_POLICY, ON_POLICY

    if cfg.policy.type not in ON_POLICY + OFF_POLICY:
        from polar.errors import ConfigError

        raise ConfigError(f"policy.type {cfg.policy.type!r}: env harnesses train with 'ppo', 'appo', 'dqn' or 'sac'")
    run_dir = RunDir.create(cfg.name, args.run_dir, config_dir=cfg.config_dir)
    return train(cfg, run_dir, resume=False, progress=not args.no_progress, log_every_s=args.log_every_s)


def train(cfg, run_dir, resume: bool, progress: bool = True, log_every_s: float = 30.0) -> int:
    from rich.console import Console

    from polar.cli._progress import TrainingProgress, fmt_number, print_eval
    from polar.trainers.lifecycle import run_guard
    from polar.trainers.on_policy import build_trainer

    Console(stderr=True).print(f"[bold]run dir[/]: {run_dir.path}")
    enabled = progress and cfg.logging.progress_bar
    # run.json records this process as the run's owner and its final status, however it ends
    with run_guard(run_dir, cfg.logging.sigterm_grace_s), \
            TrainingProgress(cfg.total_env_steps, 0, enabled, cfg.logging.metrics, log_every_s) as bar:
        # local: the learner runs here; ray: in a learner actor this process starts and watches
        trainer = build_trainer(cfg, run_dir, resume=resume, on_iteration=bar.update)
        result = trainer.train()
    log.info("finished: %d env steps in %.1fs, mean return %s", result["env_steps"], result["time_s"],
             fmt_number(result.get("episode_reward_mean")))
    if "eval" in result:
        print_eval(result["eval"], title=f"evaluation ({run_dir.path.name})")
    return 0
