"""The suite report: ``report.json`` (format in docs/evaluation.md), ``report.md`` and ``report.html`` (tables
and inline SVG plots of each metric's mean and interval per policy; no scripts, no network)."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polar.config.secrets import redact
from polar.evaluation.metrics import get_metric
from polar.evaluation.stats import summarize

FORMAT = 1


def _policy_info(suite: Any, p: Any) -> dict[str, Any]:
    members = [suite.policy(m) for m in p.ensemble] if p.ensemble else [p]
    return {"name": p.name, "kind": p.kind, "members": list(p.ensemble or []),
            "checkpoints": [m.checkpoint or m.run for m in members if (m.checkpoint or m.run)], "model": p.model}


def _harness_info(h: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"name": h.name, "kind": h.kind, "metrics": [m.name for m in h.metrics]}
    if h.kind == "env":
        # what the report keeps of a harness is redacted as config.resolved.yaml is (a connector token, env: keys)
        info.update(wrappers=[redact(w) for w in h.wrappers], seeds=h.seeds.model_dump(),
                    deterministic=h.deterministic, max_episode_steps=h.max_episode_steps,
                    harness=redact(h.harness) if h.harness else None, config=h.config)
    else:
        info.update(tasks=h.tasks, config=h.config, samples_per_task=h.samples_per_task, max_tasks=h.max_tasks,
                    deterministic=h.deterministic)
    return info


def metric_values(h: Any, episodes: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Per-episode values of each of the harness's metrics."""
    return {m.name: [get_metric(m.name).value(e, m) for e in episodes] for m in h.metrics}


def build_report(suite: Any, results: list[dict[str, Any]], time_s: float) -> dict[str, Any]:
    iv = suite.interval
    rows = []
    for r in results:
        h = next(x for x in suite.harnesses if x.name == r["harness"])
        values = metric_values(h, r["episodes"])
        for name, vals in values.items():
            for e, v in zip(r["episodes"], vals, strict=True):
                e.setdefault(name, v)
        metrics = {name: summarize(vals, iv.method, iv.level, iv.resamples, iv.seed) for name, vals in values.items()}
        rows.append({"harness": r["harness"], "policy": r["policy"], "error": r["error"], "time_s": r.get("time_s"),
                     "n": len(r["episodes"]), "metrics": metrics if not r["error"] else {}, "episodes": r["episodes"]})
    return {
        "format": FORMAT, "suite": suite.name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "time_s": round(time_s, 3), "interval": iv.model_dump(),
        "metric_info": {m: {"label": get_metric(m).label, "higher_is_better": get_metric(m).higher_is_better}
                        for h in suite.harnesses for m in (x.name for x in h.metrics)},
        "policies": [_policy_info(suite, p) for p in suite.policies],
        "harnesses": [_harness_info(h) for h in suite.harnesses],
        "results": rows,
    }


# ---------------------------------------------------------------- text
def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    a = abs(x)
    return f"{x:.3g}" if a and (a < 0.01 or a >= 1e4) else f"{x:.3f}".rstrip("0").rstrip(".") if a < 100 else f"{x:.1f}"


def _cell(s: dict[str, Any]) -> str:
    if not s or s.get("mean") is None:
        return "n/a"
    if s["low"] == s["high"]:
        return f"{_fmt(s['mean'])}"
    return f"{_fmt(s['mean'])} [{_fmt(s['low'])}, {_fmt(s['high'])}]"


def _interval_text(report: dict[str, Any]) -> str:
    iv = report["interval"]
    how = (f"percentile bootstrap of the mean, {iv['resamples']} resamples, seed {iv['seed']}" if iv["method"] ==
           "bootstrap" else "Student-t interval of the mean")
    return f"{iv['level'] * 100:g}% confidence intervals: {how}"


def _by_harness(report: dict[str, Any]) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    for h in report["harnesses"]:
        yield h, [r for r in report["results"] if r["harness"] == h["name"]]


def _describe(h: dict[str, Any]) -> str:
    if h["kind"] == "env":
        wr = ", ".join(f"{w['type']}({', '.join(f'{k}={v}' for k, v in w.items() if k != 'type' and v is not None)})"
                       for w in h["wrappers"]) or "no wrappers"
        s = h["seeds"]
        return (f"env harness; {wr}; seeds {s['start']}..{s['start'] + s['count'] - 1}; "
                f"{'deterministic' if h['deterministic'] else 'stochastic'} actions")
    return (f"agent harness; tasks {h['tasks'] or '(config eval_tasks)'}; {h['samples_per_task']} per task; "
            f"{'greedy' if h['deterministic'] else 'sampled'} decoding")


def to_markdown(report: dict[str, Any]) -> str:
    out = [f"# Evaluation report: {report['suite']}", "",
           f"Created {report['created']} in {report['time_s']:.1f} s. {_interval_text(report)}.", ""]
    for h, rows in _by_harness(report):
        out += [f"## {h['name']}", "", _describe(h), ""]
        cols = h["metrics"]
        out.append("| policy | n | " + " | ".join(cols) + " |")
        out.append("|---|---|" + "---|" * len(cols))
        for r in rows:
            if r["error"]:
                out.append(f"| {r['policy']} | 0 | error: {r['error']} |" + " |" * (len(cols) - 1))
            else:
                out.append(f"| {r['policy']} | {r['n']} | " + " | ".join(_cell(r["metrics"][c]) for c in cols) + " |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------- html + svg
_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def svg_bars(title: str, bars: list[tuple[str, dict[str, Any]]], width: int = 360, height: int = 0) -> str:
    """Horizontal bars of each policy's mean with its interval as a whisker."""
    e = html.escape
    vals = [b for b in bars if b[1] and b[1].get("mean") is not None]
    pad_l, pad_r, top, row = 110, 20, 26, 24
    height = max(height, top + row * max(1, len(bars)) + 24)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{e(title)}"><text x="4" y="16" font-size="13" font-weight="bold">{e(title)}</text>']
    if not vals:
        parts.append('<text x="4" y="44" font-size="12">no values</text></svg>')
        return "".join(parts)
    lo = min(0.0, *(min(s["low"], s["mean"]) for _, s in vals))
    hi = max(0.0, *(max(s["high"], s["mean"]) for _, s in vals))
    span = (hi - lo) or 1.0
    x = lambda v: pad_l + (v - lo) / span * (width - pad_l - pad_r)  # noqa: E731
    parts.append(f'<line x1="{x(0):.1f}" y1="{top - 4}" x2="{x(0):.1f}" y2="{height - 20}" stroke="#999"/>')
    for i, (name, s) in enumerate(bars):
        y = top + i * row
        parts.append(f'<text x="{pad_l - 6}" y="{y + 14}" font-size="12" text-anchor="end">{e(name)}</text>')
        if not s or s.get("mean") is None:
            parts.append(f'<text x="{pad_l + 4}" y="{y + 14}" font-size="11" fill="#888">n/a</text>')
            continue
        x0, x1 = sorted((x(0), x(s["mean"])))
        parts.append(f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(1.0, x1 - x0):.1f}" height="14" '
                     f'fill="{_COLORS[i % len(_COLORS)]}"><title>{e(name)}: {e(_cell(s))}</title></rect>')
        if s["low"] != s["high"]:
            parts.append(f'<line x1="{x(s["low"]):.1f}" y1="{y + 10}" x2="{x(s["high"]):.1f}" y2="{y + 10}" '
                         'stroke="#222" stroke-width="1.5"/>')
            for v in (s["low"], s["high"]):
                parts.append(f'<line x1="{x(v):.1f}" y1="{y + 5}" x2="{x(v):.1f}" y2="{y + 15}" stroke="#222"/>')
    parts.append(f'<text x="{pad_l}" y="{height - 6}" font-size="10" fill="#555">{e(_fmt(lo))}</text>'
                 f'<text x="{width - pad_r}" y="{height - 6}" font-size="10" fill="#555" text-anchor="end">'
                 f'{e(_fmt(hi))}</text></svg>')
    return "".join(parts)


def to_html(report: dict[str, Any]) -> str:
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'>",
           f"<title>{e(report['suite'])}: evaluation report</title><style>",
           "body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}"
           "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th:first-child,td:first-child{text-align:left}"
           ".plots{display:flex;flex-wrap:wrap;gap:12px}.err{color:#b00}.note{color:#555}",
           "</style></head><body>", f"<h1>Evaluation report: {e(report['suite'])}</h1>",
           f"<p class='note'>Created {e(report['created'])} in {report['time_s']:.1f} s. {e(_interval_text(report))}.</p>"]
    info = report.get("metric_info", {})
    for h, rows in _by_harness(report):
        out += [f"<h2>{e(h['name'])}</h2>", f"<p class='note'>{e(_describe(h))}</p>", "<table><tr><th>policy</th><th>n</th>"]
        out += [f"<th>{e(c)}</th>" for c in h["metrics"]] + ["</tr>"]
        for r in rows:
            if r["error"]:
                out.append(f"<tr><td>{e(r['policy'])}</td><td>0</td><td class='err' colspan='{len(h['metrics'])}'>"
                           f"error: {e(r['error'])}</td></tr>")
            else:
                out.append(f"<tr><td>{e(r['policy'])}</td><td>{r['n']}</td>"
                           + "".join(f"<td>{e(_cell(r['metrics'][c]))}</td>" for c in h["metrics"]) + "</tr>")
        out.append("</table><div class='plots'>")
        for c in h["metrics"]:
            label = info.get(c, {}).get("label") or c
            out.append(svg_bars(label, [(r["policy"], r["metrics"].get(c, {})) for r in rows]))
        out.append("</div>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    from polar.trainers.run_dir import atomic_write_text

    out = Path(out_dir)
    paths = {"json": out / "report.json", "md": out / "report.md", "html": out / "report.html"}
    atomic_write_text(paths["json"], json.dumps(report, indent=1, default=str) + "\n")
    atomic_write_text(paths["md"], to_markdown(report) + "\n")
    atomic_write_text(paths["html"], to_html(report) + "\n")
    return paths
