"""``polar eval RUN_DIR|CHECKPOINT [--episodes N]``: deterministic evaluation on fresh env instances.

For an agent run (``harness.type: agent``) it runs the run's held-out ``eval_tasks`` with the checkpoint's
weights through the same pipeline and success measure as the held-out evaluation at the end of ``polar run``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

HELP = "evaluate a run's latest checkpoint (or a given checkpoint file)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="run directory, or a checkpoint file inside one")
    p.add_argument("--episodes", type=int, default=None,
                   help="episodes to run (default: eval.episodes); agent runs: sessions per held-out task "
                        "(default: policy.kwargs.eval_samples)")
    p.add_argument("--seed", type=int, default=None, help="env seed (default: eval.seed)")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of the deterministic ones")


def main(args: argparse.Namespace) -> int:
    from polar.cli._progress import print_eval
    from polar.errors import ConfigError
    from polar.trainers.evaluation import evaluate_policy
    from polar.trainers.loading import load_policy_for_eval, resolve_target

    if args.episodes is not None and args.episodes < 1:
        raise ConfigError("--episodes must be at least 1")
    run_dir, cfg, ckpt = resolve_target(Path(args.target))
    from rich.console import Console

    from polar.trainers.run_dir import status_line

    Console(stderr=True).print(status_line(run_dir.path), markup=False, highlight=False)  # e.g. a run that was killed
    if cfg.harness.type == "agent":
        return _eval_agent_run(run_dir, cfg, ckpt, args.episodes)
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


def _eval_agent_run(run_dir, cfg, ckpt: Path | None, samples: int | None) -> int:
    """An agent run: its held-out ``eval_tasks`` with the checkpoint's weights, as the end of ``polar run``."""
    from rich.console import Console

    from polar.trainers.agentic_run import evaluate_agent_run, heldout_table

    res = evaluate_agent_run(run_dir, cfg, ckpt, samples)
    name = Path(res["checkpoint"]).stem
    out = run_dir.write_json(f"eval/eval_{name}_{time.strftime('%Y%m%d-%H%M%S')}.json", res)
    console = Console(stderr=True)
    console.print(heldout_table(f"{cfg.name}: held-out success of {name} ({res['samples_per_task']} per task)",
                                {name: res}))
    console.print(f"written: {out}")
    return 0
