"""The benchmark harness: one chat call per session, the task's prompt in, the model's answer out.

Name it as ``harness: {type: agent, callable: "polar.harness.benchmarks.chat:answer"}``. The task carries
its own generation settings (``max_tokens``, ``temperature``, ``system_prompt``, ``stop``), written by its
task source, so one harness serves every benchmark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polar.harness.agent.runners import task_prompt

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam


async def answer(base_url: str, api_key: str, task: dict[str, Any], model: str = "polar") -> str:
    """The model's reply to the task's prompt, through the gateway (official openai SDK)."""
    from openai import AsyncOpenAI

    messages: list[ChatCompletionMessageParam] = []
    if task.get("system_prompt"):
        messages.append({"role": "system", "content": task["system_prompt"]})
    messages.append({"role": "user", "content": task_prompt(task)})
    extra = {"stop": task["stop"]} if task.get("stop") else {}
    # no client timeout of its own (the SDK's default gives up after 600 s): the harness's timeout_s bounds
    # the call, so a slow engine is waited for as long as the config allows
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=None) as client:
        resp = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=int(task.get("max_tokens", 64)),
            temperature=float(task.get("temperature", 1.0)), **extra)
    return resp.choices[0].message.content or ""
