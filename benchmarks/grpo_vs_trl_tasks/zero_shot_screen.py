"""Zero-shot screen of reasoning-gym families at their default difficulty: exact success of a model's reply over
the first N held-out items (seeds from 1,000,000, as make_tasks.py's held-out files), sampled at temperature 1.0
and greedy, 64 new tokens, the answer read as the reply's last number (numeric answers) or its last line, scored
by the dataset's own ``score_answer``. It picks families for benchmarks/grpo_vs_trl.py without training anything.

    .venv/bin/python benchmarks/grpo_vs_trl_tasks/zero_shot_screen.py --items 32 letter_counting aiw gcd

One JSON line per family: ``{"family", "T1", "greedy"}``.
"""

from __future__ import annotations

import argparse
import json
import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract(answer: str, reply: str) -> str:
    if NUMBER.fullmatch(answer.strip()):
        found = NUMBER.findall(reply.replace(",", ""))
        return found[-1] if found else ""
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("families", nargs="+")
    p.add_argument("--items", type=int, default=32)
    p.add_argument("--model", default="smollm2-135m", help="a polar preset or an HF folder")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    import reasoning_gym
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from polar.inference.vllm_launcher import resolve_model_folder

    torch.set_num_threads(args.threads)
    folder = str(resolve_model_folder(args.model, "--model"))
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for family in args.families:
        ds = reasoning_gym.create_dataset(family, size=args.items, seed=1_000_000)
        items = [ds[i] for i in range(args.items)]
        result: dict[str, object] = {"family": family}
        for mode in ("T1", "greedy"):
            ok = 0
            for i in range(0, len(items), 16):
                chunk = items[i:i + 16]
                texts = [tok.apply_chat_template([{"role": "user", "content": it["question"]}], tokenize=False,
                                                 add_generation_prompt=True) for it in chunk]
                enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
                sampling = ({"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0} if mode == "T1"
                            else {"do_sample": False})
                with torch.no_grad():
                    out = model.generate(**enc, max_new_tokens=64, pad_token_id=tok.pad_token_id, **sampling)
                replies = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                ok += sum(ds.score_answer(extract(str(it["answer"]), r), it) >= 1.0 for it, r in zip(chunk, replies, strict=True))
            result[mode] = ok / len(items)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
