"""Partial rollouts against one-step-off overlap on the sums benchmark: GRPO step throughput and held-out gain.

    python benchmarks/partial_rollouts.py [--seeds 0 1 2] [--max-staleness K] [--json out.json] [-o KEY=VALUE ...]

Runs ``examples/agentic/real_model_grpo.yaml`` (SmolLM2-135M-Instruct learns 1-20 sums through an unmodified
anthropic-SDK agent; ``benchmarks/agentic_real_model.py`` is the same run, timed) on the embedded engine, the one
that can go on sampling across a weight update, in two modes per seed, one after the other:

- ``one-step-off``: ``max_off_policy_steps: 1``, today's overlap (the next batch is collected while one trains; a
  weight sync waits for the calls under way);
- ``partial``: ``max_off_policy_steps: K`` and ``partial_rollouts: {}`` (groups run on across weight updates, each
  step takes the first to finish, each token tagged with its version, none more than K behind).

It prints one row per run and one per mode: GRPO steps per minute over the GRPO phase (from the first step's
collection to the last step's sync, evaluations excluded), its split into collection wait, learning and sync,
held-out exact success before and after (200 unseen pairs) with its standard error, the gain, the groups dropped
as stale and the mean policy lag; then the throughput ratio and whether the gains differ by more than twice the
standard error of their difference. ``-o`` overrides apply to both modes (``-o model.name_or_path=tiny`` and
small step counts make a smoke run).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from agentic_real_model import log_progress, run_apart, run_arguments, run_one, save_rows  # noqa: E402  (the same config, timed)

MODES = ("one-step-off", "partial")


def mode_overrides(mode: str, max_staleness: int) -> list[str]:
    if mode == "one-step-off":
        return ["policy.kwargs.max_off_policy_steps=1", "gateway.sync.in_flight=finish"]
    return [f"policy.kwargs.max_off_policy_steps={max_staleness}", "policy.kwargs.partial_rollouts={}",
            "gateway.sync.in_flight=continue"]


def stderr(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / max(1, n))


def row_of(mode: str, seed: int, r: dict[str, Any], stale: float, lags: list[float]) -> dict[str, Any]:
    phase_s = r["collect_s"] + r["learn_s"] + r["sync_s"]
    n = int(r["eval_sessions"] or 0)
    return {"mode": mode, "seed": seed, "steps": r["steps"], "grpo_s": round(phase_s, 1),
            "steps_per_min": round(60 * r["steps"] / phase_s, 3) if phase_s else None,
            "collect_s_per_step": r["collect_s_per_step"], "learn_s_per_step": r["learn_s_per_step"],
            "sync_s_per_step": r["sync_s_per_step"], "before": r["before"], "after": r["after"],
            "gain": round(r["after"] - r["before"], 4), "after_se": round(stderr(r["after"], n), 4),
            "eval_sessions": n, "groups_stale": stale, "policy_lag_mean": round(sum(lags) / len(lags), 3) if lags else None,
            "tokens_per_s": r["tokens_per_s"], "load_average": r["load_average"], "run_dir": r["run_dir"]}


def run_mode(mode: str, seed: int, config: str, overrides: list[str], max_staleness: int,
             run_root: str | None) -> dict[str, Any]:
    r = run_one(config, "embedded", [f"seed={seed}", *mode_overrides(mode, max_staleness), *overrides], run_root)
    from polar.metrics.logger import read_metrics

    rows = [m for m in read_metrics(Path(r["run_dir"]) / "metrics.jsonl") if "reward_mean" in m]
    stale = float(sum(float(m.get("partial/groups_stale", 0.0)) for m in rows))
    lags = [float(m["policy_lag"]) for m in rows if m.get("policy_lag") is not None]
    return row_of(mode, seed, r, stale, lags)


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: the mean steps/min over its runs, and its mean gain with that mean's standard error."""
    out: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode and r["steps_per_min"]]
        if not mine:
            continue
        gains = [r["gain"] for r in mine]
        # one evaluation's standard error of its after score, over the runs' mean
        se = math.sqrt(sum(r["after_se"] ** 2 for r in mine)) / len(mine)
        out[mode] = {"runs": len(mine), "steps_per_min": round(sum(r["steps_per_min"] for r in mine) / len(mine), 3),
                     "gain": round(sum(gains) / len(gains), 4), "gain_se": round(se, 4)}
    return out


def table(rows: list[dict[str, Any]]) -> str:
    def f(v: Any, fmt: str = "{}") -> str:
        return "-" if v is None else fmt.format(v)

    head = ["mode", "seed", "steps", "GRPO s", "steps/min", "collect wait s/step", "learn s/step", "sync s/step",
            "before", "after (se)", "gain (pts)", "stale groups", "policy lag"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["mode"], str(r["seed"]), str(r["steps"]), f(r["grpo_s"], "{:.0f}"), f(r["steps_per_min"], "{:.2f}"),
            f(r["collect_s_per_step"], "{:.1f}"), f(r["learn_s_per_step"], "{:.1f}"), f(r["sync_s_per_step"], "{:.2f}"),
            f(r["before"], "{:.3f}"), f"{r['after']:.3f} ({r['after_se']:.3f})", f"{100 * r['gain']:+.1f}",
            f(r["groups_stale"], "{:.0f}"), f(r["policy_lag_mean"], "{:.2f}")]) + " |")
    s = summary(rows)
    out = ["\n".join(lines), ""]
    for mode, m in s.items():
        out.append(f"{mode}: {m['runs']} run(s), {m['steps_per_min']:.2f} steps/min, held-out gain "
                   f"{100 * m['gain']:+.1f} +- {100 * m['gain_se']:.1f} pts (one standard error)")
    if set(s) == set(MODES):
        base, part = s["one-step-off"], s["partial"]
        ratio = part["steps_per_min"] / base["steps_per_min"]
        diff = part["gain"] - base["gain"]
        se = math.hypot(base["gain_se"], part["gain_se"])
        out.append(f"throughput partial / one-step-off: {ratio:.2f}x (target >= 1.3x); gain difference "
                   f"{100 * diff:+.1f} pts, {'within' if abs(diff) <= 2 * se else 'outside'} 2 standard errors "
                   f"({100 * 2 * se:.1f} pts)")
    return "\n".join(out)


def main() -> int:
    ap = run_arguments(__doc__.split("\n")[0], "write the rows here (after each run)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--max-staleness", type=int, default=1, help="K of the partial mode (max_off_policy_steps)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = ap.parse_args()
    log_progress()
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        for mode in args.modes:  # the modes of one seed back to back: the box's load is as alike as it gets
            rows.append(run_apart(run_mode, mode, seed, args.config, args.override, args.max_staleness, args.run_dir))
            save_rows(args.json, rows, summary=summary(rows))
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
