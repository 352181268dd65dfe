"""The agentic learning run: SFT warm-up, then GRPO, on the calculator agent with the tiny model.

    OMP_NUM_THREADS=1 python benchmarks/agentic_grpo.py [-o policy.kwargs.total_steps=20 ...]

Runs exactly what ``polar run --config examples/agentic/calculator_grpo.yaml`` runs (in this process)
and prints held-out success after SFT and after GRPO, the GRPO wall time, and the per-step reward.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "examples" / "agentic" / "calculator_grpo.yaml"))
    ap.add_argument("-o", "--override", action="append", default=[])
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--init-state", default=None,
                    help="start from these weights (a torch state dict of the tiny model, e.g. a longer SFT run's); "
                         "combine with -o sft_warmup=null")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from polar.config import load_config
    from polar.metrics.logger import read_metrics
    from polar.trainers.build import train_agentic
    from polar.trainers.run_dir import RunDir

    cfg = load_config(args.config, args.override)
    run_dir = RunDir.create(cfg.name, args.run_dir or tempfile.mkdtemp(prefix="polar-bench-"), kind="agentic-grpo")
    engine = None
    if args.init_state:
        import torch

        from polar.inference import load_engine

        engine = load_engine(cfg.model.name_or_path, seed=cfg.seed)
        engine.model.load_state_dict(torch.load(args.init_state, map_location="cpu", weights_only=True))
    s = train_agentic(cfg, run_dir, engine=engine)
    rows = [r for r in read_metrics(run_dir.metrics_path) if "reward_mean" in r]
    before, after = s["eval_before"]["success"], s["eval_after"]["success"]
    print(f"\nrun dir: {run_dir.path}")
    if "sft" in s:
        print(f"SFT: {s['sft']['updates']} steps, loss {s['sft']['first']['sft_loss']:.3f} -> {s['sft']['last']['sft_loss']:.3f}, {s['sft']['time_s']} s")
    print(f"{'stage':<14}{'held-out success':>18}{'sessions':>10}")
    print(f"{'after SFT':<14}{before:>18.3f}{s['eval_before']['sessions']:>10}")
    print(f"{'after GRPO':<14}{after:>18.3f}{s['eval_after']['sessions']:>10}")
    print(f"GRPO: {s['grpo']['steps']} steps in {s['grpo']['time_s']} s; held-out +{100 * (after - before):.1f} points")
    print("per-step train reward:", json.dumps([round(r["reward_mean"], 3) for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
