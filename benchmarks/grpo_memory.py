"""Peak resident memory of one GRPO step: full fine-tune and LoRA, with and without a KL reference.

Each case runs in a fresh subprocess (peak RSS, ``VmHWM``, is a process-lifetime peak, so cases must not
share one): load the model, build the learner, run one ``GRPOLearner.optimize`` on a synthetic batch, report
the peak RSS after loading and after the step. The batch is ``--sequences`` sequences of ``--tokens``
tokens with the last three quarters as targets (micro-batches of ``--micro-batch``).

    .venv/bin/python benchmarks/grpo_memory.py                      # tiny and, if available, smollm2-135m
    .venv/bin/python benchmarks/grpo_memory.py --models tiny --json out.json
    .venv/bin/python benchmarks/grpo_memory.py --models smollm2-135m --lora-defaults   # LoraConfig() as shipped

The LoRA cases use r=8 on the attention projections (the defaults before issue 11's item 6), or with
``--lora-defaults`` today's ``LoraConfig()`` (r=16 on every linear projection).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = [  # (label, lora, kl_coef)
    ("full", False, 0.0),
    ("full + KL (frozen copy)", False, 0.05),
    ("LoRA r=8", True, 0.0),
    ("LoRA r=8 + KL (adapters off)", True, 0.05),
]


def _peak_mib() -> float:
    """This process's peak RSS. Linux's ``ru_maxrss`` survives ``execve`` (a child forked from a big
    parent starts at the parent's peak), so read ``VmHWM``, which the new image starts afresh."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run_case(model_name: str, lora: bool, kl_coef: float, sequences: int, tokens: int, micro_batch: int,
             gradient_checkpointing: bool, lora_defaults: bool = False) -> dict:
    """One case in this process (the parent runs each in a subprocess)."""
    import torch

    from polar.algorithms.grpo import GRPOLearner
    from polar.config.grpo import GRPOKwargs, LoraConfig
    from polar.models.llm_policy import LLMPolicy
    from polar.types import TrajectorySample

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    base_mib = _peak_mib()
    if model_name == "tiny":
        from polar.inference.tiny import build_tiny

        model, tok = build_tiny(0)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from polar.inference.presets import preset_folder

        folder = preset_folder(model_name)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder)
    cfg = (LoraConfig() if lora_defaults else LoraConfig(r=8, alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])) \
        if lora else None
    kw = GRPOKwargs(kl_coef=kl_coef, lora=cfg, micro_batch_size=micro_batch, learning_rate=1e-5)
    policy = LLMPolicy(model, tok, cfg, gradient_checkpointing=gradient_checkpointing)
    learner = GRPOLearner(policy, kw)
    loaded_mib = _peak_mib()
    g = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    targets = [0] * (tokens // 4) + [1] * (tokens - tokens // 4)
    samples = [TrajectorySample(session_id=f"s{i}", token_ids=torch.randint(0, vocab, (tokens,), generator=g).tolist(),
                                loss_mask=targets, logprobs=[-3.0] * tokens, policy_versions=[0] * tokens,
                                call_indices=[0] * tokens, reward=float(i % 2)) for i in range(sequences)]
    advs = [1.0 if i % 2 else -1.0 for i in range(sequences)]
    t0 = time.perf_counter()
    stats = learner.optimize(samples, advs)
    step_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in policy.parameters())
    return {"model": model_name, "lora": lora, "kl_coef": kl_coef, "params": n_params, "trainable": trainable,
            "reference": learner.reference_kind, "interpreter_mib": round(base_mib, 1),
            "after_load_mib": round(loaded_mib, 1), "peak_step_mib": round(_peak_mib(), 1), "step_s": round(step_s, 2),
            "loss_finite": all(v == v for v in stats.values()), "gradient_checkpointing": gradient_checkpointing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=None, help="default: tiny, plus smollm2-135m if its preset resolves")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--lora-defaults", action="store_true", help="LoRA cases with LoraConfig() (r=16, all linear)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print its JSON
    args = ap.parse_args()
    if args.case:
        model_name, lora, kl = json.loads(args.case)
        print(json.dumps(run_case(model_name, lora, kl, args.sequences, args.tokens, args.micro_batch,
                                  args.gradient_checkpointing, args.lora_defaults)))
        return
    models = args.models
    if models is None:
        models = ["tiny"]
        try:
            from polar.inference.presets import preset_folder

            preset_folder("smollm2-135m")
            models.append("smollm2-135m")
        except Exception as e:  # a benchmark reports what it could not measure and goes on
            print(f"smollm2-135m skipped: {e}", file=sys.stderr)
    rows = []
    for m in models:
        for label, lora, kl in CASES:
            cmd = [sys.executable, __file__, "--case", json.dumps([m, lora, kl]), "--sequences", str(args.sequences),
                   "--tokens", str(args.tokens), "--micro-batch", str(args.micro_batch)]
            if args.gradient_checkpointing:
                cmd.append("--gradient-checkpointing")
            if args.lora_defaults:
                cmd.append("--lora-defaults")
                if not lora:
                    continue  # the full fine-tune cases do not change with the LoRA defaults
                label = label.replace("LoRA r=8", "LoRA r=16, all linear")
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"{m} {label}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1]) | {"case": label}
            rows.append(row)
            print(f"| {m} | {label} | {row['trainable'] / 1e6:.2f}M / {row['params'] / 1e6:.2f}M | "
                  f"{row['after_load_mib']:.0f} | {row['peak_step_mib']:.0f} | {row['step_s']:.2f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
