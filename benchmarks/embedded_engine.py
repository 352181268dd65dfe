"""Embedded engine throughput: polar's continuous batching vs Hugging Face ``generate``, side by side.

The model is a random Qwen2 (hidden 256, 4 layers, the tiny preset's tokenizer) so the run needs no
download; every run generates the same number of new tokens per request (``--new-tokens``, no stop
tokens). Peers, in the same process and on the same weights:

- ``hf sequential``: ``model.generate`` one request at a time (what a naive in-process server does);
- ``hf static batch``: one left-padded ``model.generate`` call for all N requests at once (an upper
  bound that needs every request up front, unlike a server receiving requests over time).

polar runs N concurrent ``generate`` streams through :class:`EmbeddedEngine`. Prints tokens/s and
ratios. Usage: ``OMP_NUM_THREADS=2 python benchmarks/embedded_engine.py [--concurrency 1 8 32]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from polar.inference import GenerationRequest, collect
from polar.inference.embedded import EmbeddedEngine
from polar.inference.tiny import build_tiny_tokenizer


def make_model(vocab: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def prompts_for(tok, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"request {i}: " + "tell me about the weather " * (1 + i % 5)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(tok.encode(text, add_special_tokens=False))
    return out


def hf_sequential(model, prompts, new_tokens: int) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        for p in prompts:
            model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                pad_token_id=0,
            )
    return time.perf_counter() - t0


def hf_static_batch(model, prompts, new_tokens: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=True,
            pad_token_id=0,
        )
    return time.perf_counter() - t0


def polar_concurrent(engine, prompts, new_tokens: int) -> float:
    async def go():
        reqs = [
            GenerationRequest(p, max_tokens=new_tokens, temperature=1.0, seed=i)
            for i, p in enumerate(prompts)
        ]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(collect(engine.generate(r)) for r in reqs))
        assert all(len(r.token_ids) == new_tokens for r in results)
        return time.perf_counter() - t0

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    tok = build_tiny_tokenizer()
    model = make_model(len(tok))
    engine = EmbeddedEngine(model, tok, model_name="bench", max_batch_size=max(args.concurrency))
    polar_concurrent(engine, prompts_for(tok, 2), 4)  # warm-up (thread start, allocator)
    rows = []
    for n in args.concurrency:
        prompts = prompts_for(tok, n)
        total = n * args.new_tokens
        times: dict[str, list[float]] = {"polar": [], "seq": [], "static": []}
        for _ in range(args.repeats):  # interleaved repeats, best of each: robust to a busy machine
            times["polar"].append(polar_concurrent(engine, prompts, args.new_tokens))
            times["seq"].append(hf_sequential(model, prompts, args.new_tokens))
            times["static"].append(hf_static_batch(model, prompts, args.new_tokens))
        t_polar, t_seq, t_static = (min(times[k]) for k in ("polar", "seq", "static"))
        rows.append((n, total / t_polar, total / t_seq, total / t_static))
    asyncio.run(engine.close())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}; model: Qwen2 h256 L4 (random), "
        f"{args.new_tokens} new tokens/request, best of {args.repeats}"
    )
    print(
        f"{'N':>4} {'polar tok/s':>12} {'hf seq tok/s':>13} {'hf static tok/s':>16} {'polar/seq':>10} {'polar/static':>13}"
    )
    for n, p, s, st in rows:
        print(f"{n:>4} {p:>12.0f} {s:>13.0f} {st:>16.0f} {p / s:>10.2f} {p / st:>13.2f}")


if __name__ == "__main__":
    main()
