"""``polar export RUN_DIR [--checkpoint N] --format onnx|torchscript [--quantize int8] --out DIR``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

HELP = "export a run's policy as ONNX or TorchScript (normalisation and action post-processing baked in)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="run directory, or a checkpoint file inside one")
    p.add_argument("--checkpoint", type=int, default=None, metavar="N",
                   help="export ckpt_N (the iteration number) instead of the latest checkpoint")
    p.add_argument("--format", choices=["onnx", "torchscript"], default="onnx", help="graph format (default onnx)")
    p.add_argument("--quantize", choices=["int8"], default=None,
                   help="also write a dynamically quantised int8 graph (onnx only) and serve that one")
    p.add_argument("--out", required=True, help="directory to write the graph and manifest.json into")
    p.add_argument("--samples", type=int, default=1000, help="recorded observations for the parity check")
    p.add_argument("--seed", type=int, default=0, help="env seed for recording the parity observations")
    p.add_argument("--trust-code", action="store_true",
                   help="export a run whose config names code (a custom agent, env or connector), which exporting "
                        "imports: only for runs you trust")


def main(args: argparse.Namespace) -> int:
    from polar.cli._progress import cli_console
    from polar.deploy.export import export_run

    m = export_run(args.target, args.out, args.format, args.checkpoint, args.quantize, args.samples, args.seed,
                   trust_code=args.trust_code)
    console = cli_console()
    for pid, one in m.get("policies", {"": m}).items():  # a multi-agent run: one export per policy id
        _report(console, one, str(Path(args.out) / pid) if pid else args.out)
    return 0


def _report(console: Any, m: dict[str, Any], out: str) -> None:
    parity = m["parity"]
    rows = [r for part in ("vs_policy_act", "deterministic", "sampled") if part in parity
            for r in parity[part].values()]
    worst = max((r.get("max_abs", 0.0) for r in rows), default=0.0)
    worst_rel = max((r.get("max_rel", 0.0) for r in rows), default=0.0)
    console.print(f"exported {m['run']['checkpoint']} of {m['name']} as {m['format']} (version {m['version']}) "
                  f"to {out}", markup=False, highlight=False)
    discrete = m["graph"]["kind"] in ("categorical", "multi_categorical", "q_greedy")
    # the check is relative: |delta| / max(1, |eager|) <= tolerance, so an absolute delta above it can pass
    console.print(f"parity on {parity['samples']} recorded observations: max |delta| {worst:.2e}, max "
                  f"|delta| / max(1, |eager value|) {worst_rel:.2e} <= tolerance {parity['tolerance']:g} (relative to "
                  "values above 1, absolute below)" + ("; every action identical" if discrete else ""),
                  markup=False, highlight=False)
    if "int8" in m:
        q = m["int8"]
        what = (f"action agreement {q['action_agreement']:.2%}" if "action_agreement" in q
                else f"max |action delta| {q['action_max_abs_delta']:.3g}")
        console.print(f"int8 ({m['file']}): {what} against the eager policy", markup=False, highlight=False)
