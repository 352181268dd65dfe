"""Tokens/s of a polar-launched vLLM with and without speculative decoding, at concurrency 1 and 16.

    python examples/llm_speculative/bench.py --speculative '{"method": "ngram"}' --out spec.json
    python examples/llm_speculative/bench.py --out base.json

One vLLM replica of smollm2-135m (engine_kwargs as given), greedy requests through polar's engine (token
ids in, token ids and logprobs out). The prompts ask the model to repeat or edit a passage, the case prompt
lookup (ngram) is for. Writes tokens/s per concurrency and the greedy answers with their logprobs, so two
files can be compared token by token (docs/inference.md, Speculative decoding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

PASSAGES = [
    "The quick brown fox jumps over the lazy dog near the river bank every morning before sunrise.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n",
    "Roses are red, violets are blue, sugar is sweet, and so are you.",
    "Step 1: open the door. Step 2: walk to the table. Step 3: pick up the key. Step 4: open the box.",
]
ASKS = ["Repeat this text exactly:\n{p}", "Copy the following, word for word:\n{p}",
        "Write this out again, unchanged:\n{p}", "Echo back:\n{p}"]


def prompts(tokenizer, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        text = ASKS[i % len(ASKS)].format(p=PASSAGES[(i // len(ASKS) + i) % len(PASSAGES)])
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        out.append(tokenizer.encode(rendered, add_special_tokens=False))
    return out


async def measure(engine, ids: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    from polar.inference import GenerationRequest, collect

    gate = asyncio.Semaphore(concurrency)

    async def one(p: list[int]):
        async with gate:
            return await collect(engine.generate(GenerationRequest(
                p, max_tokens=max_tokens, temperature=0.0, stop_token_ids=engine.default_stop_token_ids, stream=False)))

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in ids))
    wall = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in results)
    return {"concurrency": concurrency, "requests": len(ids), "completion_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall,
            "answers": [{"token_ids": r.token_ids, "logprobs": r.logprobs} for r in results]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--speculative", default=None, help="engine_kwargs.speculative as JSON")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from polar.inference.vllm_launcher import launch_vllm

    kwargs = {"max_model_len": 1024, "dtype": "float32", "enforce_eager": True, "env": {"OMP_NUM_THREADS": "2"}}
    if args.speculative:
        kwargs["speculative"] = json.loads(args.speculative)
    t0 = time.perf_counter()
    engine = launch_vllm(args.model, log_dir=tempfile.mkdtemp(prefix="polar-spec-bench-"), **kwargs)
    start_s = time.perf_counter() - t0
    try:
        ids = prompts(engine.tokenizer, 16)
        asyncio.run(measure(engine, ids[:2], 2, 8))  # warm-up
        rows = [asyncio.run(measure(engine, ids[:4], 1, args.max_tokens)),
                asyncio.run(measure(engine, ids, 16, args.max_tokens))]
    finally:
        asyncio.run(engine.close())
    Path(args.out).write_text(json.dumps({"speculative": kwargs.get("speculative"), "start_s": start_s,
                                          "engine_kwargs": kwargs, "rows": rows}))
    for r in rows:
        print(f"concurrency {r['concurrency']}: {r['completion_tokens']} tokens in {r['wall_s']:.1f}s = "
              f"{r['tokens_per_s']:.1f} tokens/s")


if __name__ == "__main__":
    main()
