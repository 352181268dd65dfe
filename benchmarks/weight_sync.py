"""Weight sync per step into a real vLLM CPU server: LoRA adapters only against today's full-weight disk reload.

Each row is the median over ``--steps`` syncs of one ``engine.update_weights(payload, version)`` (what the
gateway runs at every policy update, between pausing and resuming its calls), end to end: the learner's
payload (merged weights or adapters) is made before the clock starts and timed on its own (``make_s``); the
sync includes the write, the push into the replica and the logprob check (``check_s``: 16 greedy tokens
on the replica and the learner's fp32 forward), unless the row says "no check".

Rows:
- full, disk: a full fine-tune today (``gateway.sync.method: disk``, the folder under the system temp dir);
- full, /dev/shm: the same folder on tmpfs (vLLM 0.32 has no CPU weight-transfer backend, see the notes);
- LoRA merged, disk: a LoRA run before this change (the merged model, reloaded whole);
- LoRA adapters: ``gateway.sync.lora: adapters`` (``/v1/load_lora_adapter`` of ``polar-v<version>``).

Projections for 1.7B (Qwen3-1.7B) and 8B (Llama-3.1-8B) divide each path's bytes at that size by the bytes/s
measured here for write + push (the check's cost is not projected: it is the model's own forward pass).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/weight_sync.py --steps 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# (hidden, intermediate, layers, q dim, kv dim, parameters) of the projected models, from their config.json
PROJECTED = {"1.7B (Qwen3-1.7B)": (2048, 6144, 28, 2048, 1024, 1.72e9),
             "8B (Llama-3.1-8B)": (4096, 14336, 32, 4096, 1024, 8.03e9)}


def lora_params(hidden: int, inter: int, layers: int, q: int, kv: int, rank: int) -> int:
    """Adapter parameters of rank ``rank`` on every attention and MLP projection (polar's default targets)."""
    per_layer = (hidden + q) + 2 * (hidden + kv) + (q + hidden) + 3 * (hidden + inter)
    return rank * per_layer * layers


def _base_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def _train_step(policy: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))


def _measure(engine: Any, make: Any, steps: int) -> dict[str, float]:
    rows: list[dict[str, float]] = []
    for _ in range(steps):
        t0 = time.monotonic()
        payload = make()
        make_s = time.monotonic() - t0
        version = engine.policy_version + 1
        t0 = time.monotonic()
        asyncio.run(engine.update_weights(payload, version))
        total = time.monotonic() - t0
        last = engine.last_sync
        assert last["version"] == version
        for check in last.get("checks", {}).values():
            assert check["ok"], check
        nbytes = float(last.get("bytes") or sum(t.numel() * t.element_size() for t in payload.values()))
        checks = list(last.get("checks", {}).values())
        rows.append({"total_s": total, "make_s": make_s, "write_s": last["write_s"], "push_s": last["push_s"],
                     "bytes": nbytes, "replica_check_s": sum(c.get("replica_s", 0.0) for c in checks),
                     "reference_s": sum(c.get("reference_s", 0.0) for c in checks),
                     "check_model_s": float(last.get("check_model_s", 0.0)) + float(last.get("deltas_s", 0.0))})
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--skip-full", action="store_true", help="LoRA rows only (the full rows take minutes)")
    args = ap.parse_args()

    from polar.config.grpo import LoraConfig
    from polar.config.sync import WeightSyncConfig
    from polar.inference.vllm_launcher import launch_vllm, resolve_model_folder
    from polar.models.llm_policy import LLMPolicy

    folder = resolve_model_folder(args.model)
    logs = Path(tempfile.mkdtemp(prefix="polar-bench-sync-"))
    results: dict[str, dict[str, float]] = {}
    disk_dir = logs / "sync"
    shm_dir = Path(tempfile.mkdtemp(prefix="polar-bench-sync-", dir="/dev/shm")) if Path("/dev/shm").is_dir() else None

    # one LoRA-enabled server serves every row: full reloads go to the base model's weights, adapters beside them
    engine = launch_vllm(str(folder), replicas=1, log_dir=logs, enforce_eager=True, max_model_len=1024,
                         max_lora_rank=args.rank)
    try:
        base = _base_state(folder)
        seeds = iter(range(1, 10_000))

        def full() -> dict[str, torch.Tensor]:
            gen = torch.Generator().manual_seed(next(seeds))
            return {k: v + 0.003 * torch.randn(v.shape, generator=gen) if v.ndim == 2 else v for k, v in base.items()}

        for label, kwargs in () if args.skip_full else (("full, disk", {"dir": str(disk_dir)}),
                              ("full, disk, no check", {"dir": str(disk_dir), "check": False}),
                              *((("full, /dev/shm", {"dir": str(shm_dir)}),) if shm_dir else ())):
            engine.configure_sync(WeightSyncConfig(**kwargs))
            results[label] = _measure(engine, full, args.steps)
            print(f"{label}: {results[label]}", flush=True)

        engine.configure_sync(WeightSyncConfig(dir=str(disk_dir)))
        merged = LLMPolicy.from_engine(engine, LoraConfig(r=args.rank))
        merged.sync_adapters = False  # today's LoRA run: the merged model

        def merged_step() -> dict[str, torch.Tensor]:
            _train_step(merged, next(seeds))
            return merged.serving_state_dict()

        if not args.skip_full:
            results["LoRA merged, disk"] = _measure(engine, merged_step, args.steps)
            print(f"LoRA merged, disk: {results['LoRA merged, disk']}", flush=True)

        adapters = LLMPolicy.from_engine(engine, LoraConfig(r=args.rank))
        assert adapters.sync_adapters

        def adapter_step() -> dict[str, torch.Tensor]:
            _train_step(adapters, next(seeds))
            return adapters.serving_state_dict()

        for label, kwargs in (("LoRA adapters", {"dir": str(disk_dir)}),
                              ("LoRA adapters, no check", {"dir": str(disk_dir), "check": False}),
                              ("LoRA adapters, check 4 tokens", {"dir": str(disk_dir), "check_tokens": 4})):
            engine.configure_sync(WeightSyncConfig(**kwargs))
            results[label] = _measure(engine, adapter_step, args.steps)
            print(f"{label}: {results[label]}", flush=True)
    finally:
        asyncio.run(engine.close())

    cfg = json.loads((folder / "config.json").read_text())
    hidden, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    adapter_bytes = results["LoRA adapters"]["bytes"]
    elem = adapter_bytes / lora_params(hidden, inter, layers, q, kv, args.rank)  # bytes per adapter parameter
    served_elem = elem  # both are written in the served dtype (sync.dtype: auto)

    print(f"\nWeight sync per step, {args.model}, vLLM CPU (enforce_eager), median of {args.steps}; "
          "end to end = update_weights (write + push + check)\n")
    print("| path | bytes moved | end to end s | write s | push s | check: replica call s | check: learner side s "
          "| learner payload s | MB/s (write+push) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rates: dict[str, float] = {}
    for label, r in results.items():
        moved = r["write_s"] + r["push_s"]
        rates[label] = r["bytes"] / moved if moved > 0 else float("nan")
        # the full rows' payload is this script's own perturbation of the weights, not a learner's cost
        make = "n/a" if label.startswith("full") else f"{r['make_s']:.3f}"
        print(f"| {label} | {r['bytes'] / 1e6:.1f} MB | {r['total_s']:.3f} | {r['write_s']:.3f} | {r['push_s']:.3f} "
              f"| {r['replica_check_s']:.3f} | {r['reference_s'] + r['check_model_s']:.3f} "
              f"| {make} | {rates[label] / 1e6:.0f} |")
    print("\nProjected write + push per step from the bytes/s above (check not included)\n")
    print(f"| model | full bytes | full, disk s | LoRA r={args.rank} bytes | LoRA adapters s |")
    print("|---|---:|---:|---:|---:|")
    full_rate = rates.get("full, disk", float("nan"))
    for name, (h, i, n, qd, kvd, params) in PROJECTED.items():
        fb = params * served_elem
        ab = lora_params(h, i, n, qd, kvd, args.rank) * elem
        print(f"| {name} | {fb / 1e9:.2f} GB | {fb / full_rate:.1f} | {ab / 1e6:.0f} MB | "
              f"{ab / rates['LoRA adapters']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
