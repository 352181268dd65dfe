"""The agent and verifier of ``tiny_grpo.yaml``: one model call through the gateway (official ``openai`` SDK),
rewarded when its first sampled token id is even, which the random-init tiny model hits about half the time."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI


async def short_reply(base_url: str, task: dict[str, Any], api_key: str) -> str:
    """One chat call, up to 8 sampled tokens at temperature 1."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=1, timeout=120) as client:
        r = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=8, temperature=1.0)
    return r.choices[0].message.content or ""


def even_first_token(records: list[Any]) -> float:
    """1 when the last call's first sampled token id is even."""
    return float(records[-1].sampled_ids[0] % 2 == 0)
