"""Trajectory builders side by side on a ten-turn harness: what each sends to the trainer, and the loss.

    OMP_NUM_THREADS=1 python benchmarks/builder_comparison.py [--sessions 8] [--turns 10]

Runs the example ten-turn harness (``examples/agentic/multi_turn_agent.py``, openai SDK) through the
gateway in front of the tiny model (scripted replies, real tiny-model logprobs), then builds the same
sessions with ``per_request`` and ``prefix_merging`` and reports sequences, tokens, trainable tokens,
the masked SFT/GRPO loss on identical weights, and the time of one forward+backward pass over each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def collect(sessions: int, turns: int):
    from polar.harness.agent.runners import CallableRunner
    from polar.harness.agent.verifiers import NoVerifier
    from polar.inference import ScriptedEngine
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings

    engine = ScriptedEngine.tiny(lambda req, i: f"note {i % 7} noted, value {i % 13}.")
    runner = CallableRunner("multi_turn_agent:agent", ROOT / "examples" / "agentic")
    with LocalStack(engine, runner, NoVerifier(), PipelineSettings(agent_timeout_s=600, max_run_workers=8)) as stack:
        groups = stack.run_groups([({"prompt": "Take a note.", "turns": turns}, sessions, {})], timeout_s=1800)
        records = [rec for r in groups[0] for rec in stack.gateway.records(r.session_id)]
    return records, engine


def train_pass(model, samples, pad_id: int) -> tuple[float, float]:
    """Masked NLL of the sampled tokens (token-level mean over the batch) and one forward+backward's time."""
    from polar.algorithms.sft import sft_loss
    from polar.models.llm_policy import collate

    batch = collate(samples, pad_id)
    model.zero_grad(set_to_none=True)
    t = time.perf_counter()
    logits = model(input_ids=batch.token_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    loss = sft_loss(logits, batch.token_ids, batch.loss_mask)
    loss.backward()
    return loss.item(), time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    from polar.trajectory import build

    records, engine = collect(args.sessions, args.turns)
    model = engine.model.float().train()
    pad = engine.tokenizer.pad_token_id or 0
    rows = {}
    for builder in ("per_request", "prefix_merging"):
        samples, stats = build(records, builder)
        loss, secs = train_pass(model, samples, pad)
        rows[builder] = {"sequences": len(samples), "tokens": stats["tokens_total"],
                         "trainable": stats["tokens_trainable"], "loss": loss, "fwd_bwd_s": secs,
                         "breaks": stats["prefix_breaks"]}
    pr, pm = rows["per_request"], rows["prefix_merging"]
    print(f"\n{args.sessions} sessions x {args.turns} turns ({len(records)} calls), tiny model, CPU")
    print(f"{'builder':<16}{'sequences':>10}{'tokens':>10}{'trainable':>11}{'loss':>12}{'fwd+bwd s':>11}{'breaks':>8}")
    for name, r in rows.items():
        print(f"{name:<16}{r['sequences']:>10}{r['tokens']:>10}{r['trainable']:>11}{r['loss']:>12.6f}{r['fwd_bwd_s']:>11.3f}{r['breaks']:>8}")
    print(f"{'ratio pr/pm':<16}{pr['sequences'] / pm['sequences']:>10.2f}{pr['tokens'] / pm['tokens']:>10.2f}"
          f"{pr['trainable'] / pm['trainable']:>11.2f}{abs(pr['loss'] - pm['loss']):>12.2e}{pr['fwd_bwd_s'] / pm['fwd_bwd_s']:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
