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

    # the checks first, each importing only what it needs: a config error costs no torch and no run directory
    cfg = load_config(args.config, args.override)  # validates everything before anything starts
    check_before_start(cfg)  # unknown ids, missing programs and modules: before the run directory exists
    from polar.errors import ConfigError
    from polar.trainers.agentic_run import trained_engine_problem

    problem = trained_engine_problem(cfg)  # a remote chat endpoint has no weights to train
    if problem is not None:
        raise ConfigError(problem)
    from polar.trainers.memory import memory_warning

    short = memory_warning(cfg)  # a run that will not fit says so before minutes of loading
    if short:
        log.warning(short)
    from polar.trainers.build import create_run_dir

    run_dir = create_run_dir(cfg, args.run_dir)
    return train(cfg, run_dir, resume=False, progress=not args.no_progress, log_every_s=args.log_every_s)


def train(cfg, run_dir, resume: bool, progress: bool = True, log_every_s: float = 30.0) -> int:
    """Train ``cfg`` in ``run_dir`` (``polar run``, ``polar resume``): whichever loop ``build_trainer`` picks,
    with a progress bar, the run's status in ``run.json`` and a summary at the end."""
    from polar.cli._progress import TrainingProgress, cli_console, fmt_number, print_eval
    from polar.trainers.build import build_trainer, progress_total, run_kind
    from polar.trainers.lifecycle import run_guard

    console = cli_console()
    console.print(f"[bold]run dir[/]: {run_dir.path}")
    enabled = progress and cfg.logging.progress_bar
    # run.json records this process as the run's owner and its final status, however it ends
    # GRPO agent runs count sessions and steps (session words); env runs and SFT count env/optimizer steps
    from polar.config.grpo import GRPOKwargs

    kw = cfg.policy.kwargs
    total_steps = int(kw.total_steps) if isinstance(kw, GRPOKwargs) else None
    with run_guard(run_dir, cfg.logging.sigterm_grace_s), \
            TrainingProgress(progress_total(cfg), 0, enabled, cfg.logging.metrics, log_every_s, total_steps) as bar:
        # local: the learner runs here; ray: in a learner actor this process starts and watches
        trainer = build_trainer(cfg, run_dir, resume=resume, on_iteration=bar.update)
        result = trainer.train()
    if total_steps:
        log.info("finished: %d sessions in %.1fs, reward mean of the last step %s", result["env_steps"],
                 result["time_s"], fmt_number(result.get("episode_reward_mean")))
    else:
        log.info("finished: %d env steps in %.1fs, mean return %s", result["env_steps"], result["time_s"],
                 fmt_number(result.get("episode_reward_mean")))
    if run_kind(cfg) == "agent":
        from polar.trainers.agentic_run import heldout_table

        rows = {key.removeprefix("eval_"): result[key] for key in ("eval_before", "eval_after", "eval_final")
                if result.get(key)}
        if rows:
            console.print(heldout_table(f"{cfg.name}: held-out success", rows))
        else:
            console.print("no held-out tasks: the config sets no eval_tasks, so held-out success was not measured "
                          "(add 'eval_tasks: FILE.jsonl' to measure it)")
    elif "eval" in result:
        print_eval(result["eval"], title=f"evaluation ({run_dir.path.name})")
    if result.get("continual"):
        print_continual(console, result["continual"])
    return 0


def print_continual(console, summary: dict) -> None:
    """The continual-learning lines of a run's summary: return at the start (after ``init``) and at the end on
    the run's task, and each old task's start, final and forgetting (start - final)."""
    from rich.table import Table

    from polar.cli._progress import fmt_number

    if summary.get("start_return") is not None:
        console.print(f"this task: return {fmt_number(summary['start_return'])} at the start (init from "
                      f"{summary.get('init', {}).get('source_policy', '?')}), {fmt_number(summary.get('final_return'))} "
                      f"at the end (improvement {fmt_number(summary.get('improvement'))})")
    old = summary.get("old_tasks")
    if old:
        table = Table(title="old tasks: forgetting = start - final")
        for col in ("task", "start", "final", "forgetting"):
            table.add_column(col)
        for name, t in old["tasks"].items():
            table.add_row(name, fmt_number(t["start"]), fmt_number(t["final"]), fmt_number(t["forgetting"]))
        console.print(table)
