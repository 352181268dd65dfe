"""A harness and a verifier for the GRPO run against a real vLLM (tests/inference/test_vllm.py)."""

from openai import AsyncOpenAI


async def one_token(base_url, task, api_key):
    """One model call, one sampled token."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=1, timeout=120) as client:
        r = await client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=1, temperature=1.0)
    return r.choices[0].message.content or ""


def token_reward(records):
    """A reward in five steps from the sampled token's id: groups of a real model's samples differ in it."""
    return float(records[-1].sampled_ids[0] % 5) / 4.0
