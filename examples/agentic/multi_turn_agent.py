"""A ten-turn chat harness (official ``openai`` SDK): each turn appends the model's reply and a new
user message, so every call's prompt extends the previous one. Used to compare trajectory builders:
``per_request`` sends one sequence per call, ``prefix_merging`` one per session."""

from __future__ import annotations

import os
import sys

from openai import AsyncOpenAI, OpenAI


def _messages(task: dict) -> list[dict]:
    return [{"role": "system", "content": "You are a terse note taker."}, {"role": "user", "content": task["prompt"]}]


async def agent(base_url: str, task: dict, api_key: str, model: str) -> str:
    turns = int(task.get("turns", 10))
    messages = _messages(task)
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=1, timeout=120.0) as client:
        for i in range(turns):
            r = await client.chat.completions.create(model=model, messages=messages, max_tokens=16)
            reply = r.choices[0].message.content or ""
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"Note {i + 2}, please."}]
    return reply


def main() -> int:
    task = {"prompt": sys.stdin.read().strip() or "Take a note.", "turns": int(os.environ.get("TURNS", "10"))}
    client = OpenAI()
    messages = _messages(task)
    for i in range(task["turns"]):
        r = client.chat.completions.create(model=os.environ.get("OPENAI_MODEL", "tiny"), messages=messages, max_tokens=16)
        reply = r.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"Note {i + 2}, please."}]
    print(reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
