"""Agentic GRPO on a real model: SmolLM2-135M-Instruct learns 1-20 sums through an unmodified anthropic-SDK agent.

    python benchmarks/agentic_real_model.py --engine vllm [--engine embedded] [--json out.json] [-o KEY=VALUE ...]

Runs exactly what ``polar run --config examples/agentic/real_model_grpo.yaml -o model.engine=ENGINE`` runs (in this
process, through the loop ``build_agent_loop`` composes; the wrappers here only time its phases and counts sampled tokens) and prints
one table, one row per engine: held-out exact success before and after training (``eval_tasks``: unseen pairs,
reward 1 only for the bare right number), wall time, the split between collection, learning and weight sync (total
and per step), sampled tokens/s during collection, the rollout/learner logprob gap, the share of groups with signal,
and what bounds each phase. ``--merge FILE`` adds the rows of an earlier run's ``--json`` to the table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONFIG = ROOT / "examples" / "agentic" / "real_model_grpo.yaml"

FIELDS = ("engine", "before", "after", "delta_points", "wall_s", "startup_s", "eval_before_s", "eval_after_s",
          "steps", "collect_s", "learn_s", "sync_s", "collect_s_per_step", "learn_s_per_step", "sync_s_per_step",
          "sampled_tokens", "tokens_per_s", "trained_tokens_per_s", "logprob_gap_mean", "logprob_gap_max",
          "sync_check_max_diff", "signal_share_mean", "reward_first", "reward_last", "eval_sessions",
          "calls_per_session", "bounds")


def run_one(config: str, engine: str, overrides: list[str], run_root: str | None) -> dict[str, Any]:
    """One run of the config with ``model.engine=engine``; its measurements (the keys of ``FIELDS``)."""
    from polar.config import load_config
    from polar.trainers.agentic_run import build_agent_loop
    from polar.trainers.lifecycle import run_guard
    from polar.trainers.registry import agent_algorithm
    from polar.trainers.run_dir import RunDir

    cfg = load_config(config, [f"model.engine={engine}", *overrides])
    if run_root:
        Path(run_root).mkdir(parents=True, exist_ok=True)
    run_dir = RunDir.create(cfg.name, tempfile.mkdtemp(prefix=f"{engine}-", dir=run_root), kind="agentic-grpo")
    phases: dict[str, float] = {}
    steps: list[dict[str, Any]] = []
    counts = {"sampled_tokens": 0, "calls": 0, "sessions": 0}

    def timed(evaluate: Any) -> Any:
        def evaluate_timed(tag: str, write: bool = True) -> dict[str, Any]:
            t = time.monotonic()
            res = evaluate(tag, write)
            phases[f"eval_{tag}_s"] = phases.get(f"eval_{tag}_s", 0.0) + time.monotonic() - t
            return res
        return evaluate_timed

    def counted(update: Any) -> Any:
        def update_counted(batch: Any) -> dict[str, Any]:
            results = [r for g in batch.data for r in g]
            counts["sessions"] += len(results)
            for r in results:
                for s in r.samples:
                    counts["sampled_tokens"] += int(sum(s.loss_mask))
                counts["calls"] += int(r.num_calls)
            exact = [float(r.verifier_output.get("exact", 0.0)) for r in results]
            return {**update(batch), "train_exact": sum(exact) / max(1, len(exact))}
        return update_counted

    def on_iteration(m: dict[str, Any]) -> None:
        sync = dict(getattr(trainer.collector.stack.engine, "last_sync", None) or {})
        checks = sync.get("checks") or {}
        steps.append({**m, "sync_detail": {k: sync.get(k) for k in ("version", "write_s", "push_s", "total_s")},
                      "sync_check_max_diff": max((c.get("max_abs_diff", 0.0) for c in checks.values()), default=None)})

    t0 = time.monotonic()
    with run_guard(run_dir, cfg.logging.sigterm_grace_s):
        trainer = build_agent_loop(agent_algorithm(cfg), cfg, run_dir, on_iteration=on_iteration)
        trainer.evaluator.evaluate = timed(trainer.evaluator.evaluate)  # the loop's parts, measured in place
        trainer.learner.update = counted(trainer.learner.update)
        summary = trainer.train()
    wall = time.monotonic() - t0
    return measurements(engine, cfg, summary, steps, phases, counts, wall, run_dir.path)


def _sum(rows: list[dict[str, Any]], key: str) -> float:
    return float(sum(float(r.get(key) or 0.0) for r in rows))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def measurements(engine: str, cfg: Any, summary: dict[str, Any], steps: list[dict[str, Any]], phases: dict[str, float],
                 counts: dict[str, int], wall: float, run_path: Path) -> dict[str, Any]:
    before, after = summary["eval_before"]["success"], summary["eval_after"]["success"]
    n = len(steps)
    collect, learn, sync = _sum(steps, "time/collect_s"), _sum(steps, "time/learn_s"), _sum(steps, "time/publish_s")
    trained = _sum(steps, "trained_tokens")
    gaps = [float(r["logprob_gap_mean"]) for r in steps if r.get("logprob_gap_mean") is not None]
    checks = [float(r["sync_check_max_diff"]) for r in steps if r.get("sync_check_max_diff") is not None]
    shares = [float(r["groups_signal_share"]) for r in steps if r.get("groups_signal_share") is not None]
    eval_b, eval_a = phases.get("eval_before_grpo_s", 0.0), phases.get("eval_after_grpo_s", 0.0)
    grpo_s = float(summary.get("grpo", {}).get("time_s", collect + learn + sync))
    startup = max(0.0, wall - grpo_s - eval_b - eval_a)
    kw = cfg.policy.kwargs
    sampled = counts["sampled_tokens"]
    out: dict[str, Any] = {
        "engine": engine, "before": before, "after": after, "delta_points": round(100 * (after - before), 1),
        "wall_s": round(wall, 1), "startup_s": round(startup, 1), "eval_before_s": round(eval_b, 1),
        "eval_after_s": round(eval_a, 1), "steps": n,
        "collect_s": round(collect, 1), "learn_s": round(learn, 1), "sync_s": round(sync, 1),
        "collect_s_per_step": round(collect / max(1, n), 2), "learn_s_per_step": round(learn / max(1, n), 2),
        "sync_s_per_step": round(sync / max(1, n), 2),
        "sampled_tokens": sampled, "tokens_per_s": round(sampled / collect, 1) if collect else None,
        "trained_tokens_per_s": round(trained / learn, 1) if learn else None,
        "logprob_gap_mean": round(_mean(gaps), 4) if gaps else None,
        "logprob_gap_max": round(max(float(r.get("logprob_gap_max") or 0.0) for r in steps), 4) if steps else None,
        "sync_check_max_diff": round(max(checks), 4) if checks else None,
        "signal_share_mean": round(_mean(shares), 3) if shares else None,
        "reward_first": summary.get("grpo", {}).get("reward_first"), "reward_last": summary.get("grpo", {}).get("reward_last"),
        "eval_sessions": summary["eval_before"]["sessions"],
        "calls_per_session": round(counts["calls"] / counts["sessions"], 2) if counts["calls"] else None,
        "per_step": [{"step": r.get("iteration"), "reward": round(float(r.get("reward_mean", 0.0)), 3),
                      "train_exact": r.get("train_exact"),
                      "signal_share": r.get("groups_signal_share"), "collect_s": r.get("time/collect_s"),
                      "learn_s": r.get("time/learn_s"), "sync_s": r.get("time/publish_s"),
                      "sync": r.get("sync_detail"), "logprob_gap_mean": r.get("logprob_gap_mean"),
                      "trained_tokens": r.get("trained_tokens")} for r in steps],
        "config": {"group_size": kw.group_size, "tasks_per_step": kw.tasks_per_step, "total_steps": kw.total_steps,
                   "learning_rate": kw.learning_rate, "lora": kw.lora.model_dump() if kw.lora else None,
                   "model": cfg.model.name_or_path, "replicas": cfg.model.replicas},
        "run_dir": str(run_path), "threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    sync_detail = [r.get("sync_detail") or {} for r in steps]
    writes = [d["write_s"] for d in sync_detail if d.get("write_s") is not None]
    pushes = [d["push_s"] for d in sync_detail if d.get("push_s") is not None]
    out["bounds"] = {
        "collection": (f"{engine} engine decoding {out['tokens_per_s']} sampled tokens/s on the shared cores, "
                       f"{kw.tasks_per_step * kw.group_size} sessions per step run together; each session's calls "
                       "run one after another"),
        "learning": (f"the learner's forward+backward on CPU: {out['trained_tokens_per_s']} sampled (loss) tokens/s "
                     "of the groups with signal, each pass running over the whole sequence, prompt included"),
        "sync": (f"write {_mean(writes):.2f} s + push {_mean(pushes):.2f} s per step, the rest is the logprob check and "
                 "the gateway drain" if writes and pushes else "an in-place copy of the weights under the engine's lock"),
    }
    return out


def table(rows: list[dict[str, Any]]) -> str:
    def f(v: Any, fmt: str = "{}") -> str:
        return "-" if v is None else fmt.format(v)

    head = ["engine", "before", "after", "delta (pts)", "wall (s)", "collection s (/step)", "learning s (/step)",
            "sync s (/step)", "tokens/s", "logprob gap", "signal share"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["engine"], f(r["before"], "{:.3f}"), f(r["after"], "{:.3f}"), f(r["delta_points"], "{:+.1f}"),
            f"{r['wall_s']:.0f} ({r['wall_s'] / 60:.1f} min)",
            f"{r['collect_s']:.0f} ({r['collect_s_per_step']:.1f})", f"{r['learn_s']:.0f} ({r['learn_s_per_step']:.1f})",
            f"{r['sync_s']:.0f} ({r['sync_s_per_step']:.2f})", f(r["tokens_per_s"], "{:.1f}"),
            f(r["logprob_gap_mean"], "{:.4f}"), f(r["signal_share_mean"], "{:.2f}"),
        ]) + " |")
    out = ["\n".join(lines), ""]
    for r in rows:
        out.append(f"{r['engine']}: start-up {r['startup_s']:.0f} s, evaluations {r['eval_before_s']:.0f} + "
                   f"{r['eval_after_s']:.0f} s ({r['eval_sessions']} held-out sessions each), {r['steps']} steps; "
                   f"train reward {f(r['reward_first'], '{:.3f}')} -> {f(r['reward_last'], '{:.3f}')}; "
                   f"sync check max |diff| {f(r['sync_check_max_diff'], '{:.4f}')}")
        for phase, why in r["bounds"].items():
            out.append(f"  {phase} bound: {why}")
    return "\n".join(out)


def run_arguments(description: str, json_help: str) -> argparse.ArgumentParser:
    """The options every run of this config takes (here and in ``partial_rollouts.py``): the config, ``-o``
    overrides, where the run folders go, and the ``--json`` file of rows."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("-o", "--override", action="append", default=[], metavar="KEY.PATH=VALUE")
    ap.add_argument("--run-dir", default=None, help="parent folder of the run directories (default: a temp folder)")
    ap.add_argument("--json", default=None, help=json_help)
    return ap


def log_progress() -> None:
    """The run's own progress lines on stderr, without the HTTP clients' one line per request."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "httpx2", "httpcore", "anthropic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run_apart(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a fresh process. A run's model, optimizer and engine are not handed back to the OS inside
    one process (two sums runs in one process held 18 GB), so each run starts alone and the next on the same footing."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=log_progress) as pool:
        return pool.submit(fn, *args).result()


def save_rows(path: str | None, rows: list[dict[str, Any]], **extra: Any) -> None:
    """The rows so far (and ``extra``) to ``path``, after each run, so a later failure keeps the earlier rows."""
    if path:
        Path(path).write_text(json.dumps({"rows": rows, **extra, "command": sys.argv}, indent=1, default=str))


def main() -> int:
    ap = run_arguments(__doc__.split("\n")[0], "write the rows (with per-step detail) here")
    ap.add_argument("--engine", action="append", choices=["vllm", "embedded"], help="repeatable; default: vllm")
    ap.add_argument("--merge", action="append", default=[], help="an earlier --json whose rows join the table")
    args = ap.parse_args()
    log_progress()
    rows: list[dict[str, Any]] = []
    for path in args.merge:
        rows.extend(json.loads(Path(path).read_text())["rows"])
    for engine in args.engine or ["vllm"]:
        rows.append(run_apart(run_one, args.config, engine, args.override, args.run_dir))
        save_rows(args.json, rows)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
