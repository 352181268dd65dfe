"""The GRPO learner's LM head at the trained positions only (``logits_to_keep``) against full logits.

    python benchmarks/grpo_logits_to_keep.py [--model smollm2-135m] [--samples 16] [--prompt 170] [--sampled 6]

One update's forward and backward (LoRA r16, fp32, one thread) over FrozenLake-shaped turns: a prompt of
``--prompt`` tokens and ``--sampled`` trained tokens each. Prints the wall time of both paths, the LM-head rows each computes
(each row: a vocabulary of fp32 logits, their log-softmax and grads) and the speed-up; the log-probs at the
trained positions must agree (checked).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    import polar.models.llm_policy as llm_policy
    from polar.config.grpo import LoraConfig
    from polar.inference.presets import preset_folder
    from polar.models.llm_policy import LLMPolicy
    from polar.types import TrajectorySample

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=170)
    ap.add_argument("--sampled", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = preset_folder(args.model)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    policy = LLMPolicy(model, tok, LoraConfig())
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(args.samples):
        n = args.prompt + (i % 7) * 3 + args.sampled  # prompts differ by a few tokens, as the turns' maps do
        ids = torch.randint(100, 40000, (n,), generator=g).tolist()
        samples.append(TrajectorySample(session_id=f"s{i}", token_ids=ids, loss_mask=[0] * (n - args.sampled) + [1] * args.sampled,
                                        logprobs=[-1.0] * n, policy_versions=[0] * n, call_indices=[0] * n, reward=1.0))
    keeps = llm_policy._keeps_logit_mask

    def one_update(full: bool) -> tuple[float, list]:
        llm_policy._keeps_logit_mask = (lambda m: False) if full else keeps
        outs = []
        t0 = time.perf_counter()
        for s in range(0, len(samples), args.micro_batch):
            batch = policy.collate(samples[s:s + args.micro_batch])
            logp = policy.token_logprobs(batch)
            (logp * batch.loss_mask).sum().backward()
            outs.append(logp.detach()[batch.loss_mask.bool()])
        policy.model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, outs

    rows = {}
    for name, full in (("full logits", True), ("trained positions", False)):
        one_update(full)  # warm-up
        times, outs = [], None
        for _ in range(args.repeats):
            t, outs = one_update(full)
            times.append(t)
        head_rows = sum(policy.logit_positions(samples[s:s + args.micro_batch]) if not full else
                        len(samples[s:s + args.micro_batch]) * max(len(x.token_ids) for x in samples[s:s + args.micro_batch])
                        for s in range(0, len(samples), args.micro_batch))
        rows[name] = (min(times), head_rows, outs)
    llm_policy._keeps_logit_mask = keeps
    diff = max(float((a - b).abs().max()) for a, b in zip(rows["full logits"][2], rows["trained positions"][2], strict=True))
    print(f"{args.model}: {args.samples} turns of ~{args.prompt}+{args.sampled} tokens, micro-batch {args.micro_batch}, 1 thread")
    print(f"| path | forward+backward s (best of {args.repeats}) | LM-head rows |")
    print("|---|---|---|")
    for name, (t, head_rows, _) in rows.items():
        print(f"| {name} | {t:.2f} | {head_rows} |")
    print(f"speed-up: {rows['full logits'][0] / rows['trained positions'][0]:.2f}x; max |logprob diff| {diff:.2e}")
    return 0 if diff < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
