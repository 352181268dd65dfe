"""``polar eval RUN_DIR|CHECKPOINT [--episodes N]``: deterministic evaluation on fresh env instances."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

HELP = "evaluate a run's latest checkpoint (or a given checkpoint file)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="run directory, or a checkpoint file inside one")
    p.add_argument("--episodes", type=int, default=None, help="episodes to run (default: eval.episodes)")
    p.add_argument("--seed", type=int, default=None, help="env seed (default: eval.seed)")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of the deterministic ones")


def main(args: argparse.Namespace) -> int:
    from polar.cli._progress import print_eval
    from polar.errors import ConfigError
    from polar.trainers.evaluation import evaluate_policy
    from polar.trainers.loading import load_policy_for_eval

    if args.episodes is not None and args.episodes < 1:
        raise ConfigError("--episodes must be at least 1")
    run_dir, cfg, policy, ckpt, state = load_policy_for_eval(Path(args.target))
    ev = cfg.eval
    res = evaluate_policy(policy, cfg.harness, args.episodes or ev.episodes, ev.seed if args.seed is None else args.seed,
                          not args.stochastic and ev.deterministic, ev.num_envs, cfg.config_dir)
    res.update(checkpoint=str(ckpt), env_steps=int(state["env_steps"]), iteration=int(state["iteration"]))
    out = run_dir.write_json(f"eval/eval_{ckpt.stem}_{time.strftime('%Y%m%d-%H%M%S')}.json", res)
    print_eval(res, title=f"evaluation of {ckpt.name} ({res['episodes']} episodes)")
    from rich.console import Console

    Console(stderr=True).print(f"written: {out}")
    return 0
