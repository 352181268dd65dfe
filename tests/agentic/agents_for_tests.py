"""In-process harnesses for tests (``module:function`` callables)."""

import asyncio

from openai import AsyncOpenAI


async def ask_then_sleep(base_url, task, api_key):
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60) as client:
        r = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=8)
    await asyncio.sleep(float(task.get("sleep_s", 0)))
    return r.choices[0].message.content
