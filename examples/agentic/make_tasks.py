"""Write the calculator task set (train / held-out JSONL) and SFT demonstrations for the train split.

Tasks are ``a OP b`` with single-digit operands, split by operand pair so held-out questions are
unseen combinations. Demonstrations are the ideal conversation (tool call, tool result, answer) in
OpenAI chat format, which the SFT trainer renders with the model's chat template.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from calculator_agent import TOOLS

HERE = Path(__file__).parent
N_DEMOS = 2000
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def tasks() -> list[dict]:
    out = []
    for a in range(10):
        for b in range(10):
            for op, fn in OPS.items():
                out.append({"id": f"{a}{op}{b}", "prompt": f"What is {a} {op} {b}?", "a": a, "op": op, "b": b,
                            "answer": str(fn(a, b))})
    return out


def demonstration(task: dict) -> dict:
    call = {"id": "call_0", "type": "function",
            "function": {"name": "calc", "arguments": json.dumps({"a": task["a"], "op": task["op"], "b": task["b"]})}}
    return {"tools": TOOLS, "messages": [
        {"role": "user", "content": task["prompt"]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": task["answer"]},
        {"role": "assistant", "content": task["answer"]},
    ]}


def main() -> None:
    rng = random.Random(0)
    all_tasks = tasks()
    rng.shuffle(all_tasks)
    held_out, train = all_tasks[:60], all_tasks[60:]
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", held_out)):
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Demonstrations use operands up to 99: too many combinations to memorise, so behaviour cloning has to
    # learn to copy the operands and the tool's result, which is what transfers to held-out questions.
    seen = {t["id"] for t in held_out}
    demos = []
    while len(demos) < N_DEMOS:
        a, b, op = rng.randrange(100), rng.randrange(100), rng.choice(list(OPS))
        if f"{a}{op}{b}" not in seen:
            demos.append(demonstration({"prompt": f"What is {a} {op} {b}?", "a": a, "op": op, "b": b, "answer": str(OPS[op](a, b))}))
    (HERE / "demos.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos))


if __name__ == "__main__":
    main()
