"""Write the calculator task set (train / held-out JSONL) and SFT demonstrations for the train split.

Tasks are "What is <n> squared / doubled / minus 10?" for n < 100, split at random so held-out
questions are unseen (number, verb) pairs. Demonstrations are the ideal conversation (tool call, tool result, answer) in
OpenAI chat format, which the SFT trainer renders with the model's chat template.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from calculator_agent import TOOLS

HERE = Path(__file__).parent
# One number per question, so the agent must read it (and the verb) to fill the tool call, then read the
# tool's result to answer.  verb -> (op, b or None for "the number itself")
VERBS = {"squared": ("*", None), "doubled": ("+", None), "minus 10": ("-", 10)}


def tasks() -> list[dict]:
    out = []
    for n in range(100):
        for verb, (op, b) in VERBS.items():
            b = n if b is None else b
            answer = {"+": n + b, "-": n - b, "*": n * b}[op]
            out.append({"id": f"{n} {verb}", "prompt": f"What is {n} {verb}?", "a": n, "op": op, "b": b, "answer": str(answer)})
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
    demos = [demonstration(t) for t in train]
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", held_out)):
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (HERE / "demos.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos))


if __name__ == "__main__":
    main()
