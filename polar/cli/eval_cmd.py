"""``polar eval RUN_DIR|CHECKPOINT [--episodes N]``: deterministic evaluation on fresh env instances.

For an agent run (``harness.type: agent``) it runs the run's held-out ``eval_tasks`` with the checkpoint's
weights through the same pipeline and success measure as the held-out evaluation at the end of ``polar run``."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "evaluate a run's latest checkpoint (or a given checkpoint file)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", help="run directory, or a checkpoint file inside one")
    p.add_argument("--suite", metavar="FILE", default=None,
                   help="run an evaluation suite (YAML: policies x harnesses, docs/evaluation.md) and write "
                        "report.json/.md/.html")
    p.add_argument("--out", metavar="DIR", default=None, help="--suite: where the report goes (default: the "
                                                              "suite's out_dir, else eval-reports/<name>-<time>)")
    p.add_argument("--episodes", type=int, default=None,
                   help="episodes to run (default: eval.episodes); agent runs: sessions per held-out task "
                        "(default: policy.kwargs.eval_samples)")
    p.add_argument("--seed", type=int, default=None, help="env seed (default: eval.seed)")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of the deterministic ones")
    p.add_argument("--record", type=int, nargs="?", const=3, default=None, metavar="N",
                   help="also record N episodes (default 3) frame by frame into RUN/episodes/ for `polar dashboard`")
    p.add_argument("--greedy", action="store_true",
                   help="agent runs: every model call at temperature 0, whatever agent.temperature says")
    p.add_argument("--action-cache", type=int, default=None, metavar="ENTRIES",
                   help="agent runs: replay the answer to a greedy prompt already asked (at most ENTRIES kept, "
                        "64 MiB); needs --greedy or agent.temperature: 0; the hit rate is in the result")
    p.add_argument("--trust-code", action="store_true",
                   help="evaluate runs whose config names code (a custom agent, env, connector, harness or "
                        "verifier), which evaluating imports or runs: only for runs you trust")


def main(args: argparse.Namespace) -> int:
    from polar.cli._progress import cli_console, print_eval
    from polar.errors import ConfigError
    from polar.trainers.build import evaluate_run, run_kind
    from polar.trainers.loading import resolve_target
    from polar.trainers.run_dir import status_line

    if args.suite:
        if args.target:
            raise ConfigError("give either a run (polar eval RUN) or --suite FILE, not both; a suite names its "
                              "runs and checkpoints under policies:")
        return _run_suite(args)
    if not args.target:
        raise ConfigError("polar eval needs a run directory or checkpoint (polar eval RUN), or --suite FILE")
    if args.episodes is not None and args.episodes < 1:
        raise ConfigError("--episodes must be at least 1")
    if args.record is not None and args.record < 1:
        raise ConfigError(f"--record must be at least 1 episode (got {args.record})")
    from polar.config.trust import require_trust

    run_dir, cfg, _ = resolve_target(Path(args.target))
    require_trust(cfg, f"run {run_dir.path}", args.trust_code)
    console = cli_console()
    console.print(status_line(run_dir.path), markup=False, highlight=False)  # e.g. a run that was killed
    if (args.greedy or args.action_cache is not None) and run_kind(cfg) != "agent":
        raise ConfigError(f"--{'greedy' if args.greedy else 'action-cache'} is for agent runs (an LLM policy); "
                          f"{run_dir.path} is an env run, evaluated deterministically already")
    if args.action_cache is not None and args.action_cache < 1:
        raise ConfigError(f"--action-cache must keep at least 1 entry (got {args.action_cache})")
    if args.record and run_kind(cfg) == "agent":
        raise ConfigError("--record is for env harnesses; an agent run's sessions are recorded already "
                          "(RUN/sessions/, shown by `polar dashboard`)")
    cache = None
    if args.action_cache is not None:
        from polar.config.gateway import ActionCacheConfig

        cache = ActionCacheConfig(max_entries=args.action_cache)
    run_dir, cfg, res = evaluate_run(args.target, args.episodes, args.seed, args.stochastic, greedy=args.greedy,
                                     action_cache=cache)
    name = Path(res["checkpoint"]).stem
    if run_kind(cfg) == "agent":
        from polar.trainers.agentic_run import heldout_table

        console.print(heldout_table(f"{cfg.name}: held-out success of {name} ({res['samples_per_task']} per task)",
                                    {name: res}))
        if "action_cache" in res:
            c = res["action_cache"]
            console.print(f"action cache: {c['hits']} hits, {c['misses']} misses (hit rate {c['hit_rate'] or 0.0:.1%}); "
                          f"sessions took {res['sessions_s']:.1f}s", markup=False, highlight=False)
    else:
        count = f"{res['episodes']} episodes" if "episodes" in res else f"{res['per_agent']['games']} games"
        print_eval(res, title=f"evaluation of {name}.pt ({count})")
    console.print(f"written: {res['written']}")
    if args.record:
        from polar.trainers.loading import load_policy_for_eval

        run_dir, cfg, policy, ckpt, state = load_policy_for_eval(Path(args.target))
        _record(args, run_dir, cfg, policy, ckpt, state)
    return 0


def _record(args: argparse.Namespace, run_dir, cfg, policy, ckpt: Path, state: dict) -> None:
    """``--record N``: N more episodes, one at a time, kept frame by frame (polar.trainers.recording)."""
    from polar.cli._progress import cli_console
    from polar.trainers.recording import record_episodes

    ev = cfg.eval
    out = record_episodes(policy, cfg.harness, run_dir.path, args.record, ev.seed if args.seed is None else args.seed,
                          not args.stochastic and ev.deterministic, cfg.config_dir,
                          meta={"checkpoint": str(ckpt), "env_steps": int(state["env_steps"]),
                                "iteration": int(state["iteration"])})
    cli_console().print(f"recorded {args.record} episodes: {out}")


def _run_suite(args: argparse.Namespace) -> int:
    """``polar eval --suite FILE``: every (harness, policy) job, then the report (polar.evaluation)."""
    from rich.table import Table

    from polar.cli._progress import cli_console
    from polar.evaluation.report import _cell
    from polar.evaluation.runner import run_suite
    from polar.evaluation.suite import load_suite

    suite = load_suite(args.suite)
    console = cli_console()
    report = run_suite(suite, args.out, trust_code=args.trust_code)
    for h in report["harnesses"]:
        table = Table(title=f"{suite.name}: {h['name']}")
        for col in ("policy", "n", *h["metrics"]):
            table.add_column(col)
        for r in (r for r in report["results"] if r["harness"] == h["name"]):
            cells = [f"error: {r['error']}"] + [""] * (len(h["metrics"]) - 1) if r["error"] else \
                [_cell(r["metrics"][m]) for m in h["metrics"]]
            table.add_row(r["policy"], str(r["n"]), *cells)
        console.print(table)
    console.print(f"written: {report['out_dir']}/report.json, report.md, report.html")
    failed = sum(1 for r in report["results"] if r["error"])
    return 1 if failed else 0
