"""In-process harnesses for tests (``module:function`` callables)."""

import asyncio

from openai import AsyncOpenAI


async def ask_then_sleep(base_url, task, api_key):
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60) as client:
        r = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=8)
    await asyncio.sleep(float(task.get("sleep_s", 0)))
    return r.choices[0].message.content


async def one_token(base_url, task, api_key):
    """One model call, one sampled token: the smallest possible agent."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=1, timeout=120) as client:
        r = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=1, temperature=1.0)
    return r.choices[0].message.content or ""


def even_token(records):
    """Reward 1 when the first sampled token id is even: learnable by the tiny model in a few steps."""
    return float(records[-1].sampled_ids[0] % 2 == 0)


def says_hello(output):
    """Reward 1 when the agent answered "hello" (SFT teaches "done" and "hello" equally; GRPO must pick)."""
    return float(output.strip() == "hello")


def smolagents_calculator(base_url, task, api_key, model):
    """A third-party agent (Hugging Face smolagents ``ToolCallingAgent``) pointed at the gateway."""
    import sys
    from pathlib import Path

    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "agentic"))
    from calculator_agent import calculator as calc

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with integers and + - *.

        Args:
            expression: the expression to evaluate, e.g. "2 + 3".
        """
        return calc(expression)

    llm = OpenAIServerModel(model_id=model, api_base=base_url, api_key=api_key)
    agent = ToolCallingAgent(tools=[calculator], model=llm, max_steps=4, verbosity_level=0)
    return str(agent.run(task["prompt"]))


async def calc_or_stall(base_url, task, api_key, session_id):
    """The calculator example agent (its own entry point, SDK retries included), except on the gateway at
    ``task["stall_on"]``: there it makes one call, leaves a marker file named after the session, and hangs
    (as a harness stuck on a dead node does). ``crash`` and ``hang_s`` make it fail in its own ways."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "agentic"))
    from calculator_agent import agent

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30) as client:
        if task.get("stall_on") and base_url.startswith(task["stall_on"]):
            await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=8)
            Path(task["marker_dir"], session_id).write_text(base_url)
            await asyncio.sleep(600)
        if task.get("crash"):
            await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=8)
            raise RuntimeError("the agent crashed")
        if task.get("hang_s"):
            await asyncio.sleep(float(task["hang_s"]))
    return await agent(base_url, task, api_key, "tiny")


def calc_verifier(task, output):
    """The calculator example's verifier, failing on demand (``task["break_verifier"]``)."""
    if task.get("break_verifier"):
        raise ValueError("the verifier is broken")
    got = output.strip().splitlines()[-1].strip() if output.strip() else ""
    return {"reward": float(got == str(task["answer"])), "got": got}


async def asks_its_own_sampling(base_url, task, api_key):
    """One model call that asks for its own sampling (temperature 1.0, 48 tokens), as SDK agents do."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=1, timeout=120) as client:
        r = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=48, temperature=1.0)
    return r.choices[0].message.content or ""


def always_one(output):
    """Every finished session passes (what is dropped is then dropped for another reason)."""
    return 1.0


async def ask_once(base_url, task, api_key):
    """One model call; its whole answer is the session's output."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60) as client:
        r = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=200)
    return r.choices[0].message.content or ""
