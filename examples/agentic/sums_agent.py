"""A multi-turn, tool-offering arithmetic agent written against the official ``anthropic`` SDK.

It knows nothing about polar. Each session asks the model a sum ("What is 7 plus 12?") with one tool offered,
``add(a, b)``; when the model calls it, the agent runs it and sends the result back. After the model's first
text reply it asks once more, for the bare number ("Now give only the final answer as a number, nothing else.
What is 7 plus 12?"), and that second text reply is the final answer. The output is one line per text reply, the final answer last.

Run it against any Anthropic-compatible server::

    echo "What is 3 plus 4?" | ANTHROPIC_BASE_URL=... ANTHROPIC_API_KEY=... python sums_agent.py

As a polar harness (``harness: {callable: sums_agent:agent}``) the question comes from the task's seed
(``sums.question``).
"""

from __future__ import annotations

import asyncio
import os
import sys

from anthropic import AsyncAnthropic

SYSTEM = "You are a helpful assistant."
FOLLOW_UP = "Now give only the final answer as a number, nothing else. {question}"  # the format, then the question
TEMPERATURE = 0.7  # sent as a body field: this SDK version's create() has no temperature argument
TOOLS = [{
    "name": "add", "description": "Add two integers.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "required": ["a", "b"]},
}]
MAX_CALLS = 4  # model calls per session: at most two tool rounds besides the two text replies
MAX_TOKENS = (32, 12)  # per call: before the follow-up, then after it


def _tool_result(block) -> str:
    args = block.input if isinstance(block.input, dict) else {}
    a, b = args.get("a"), args.get("b")
    if block.name != "add":
        return f"error: unknown tool {block.name!r}"
    if not isinstance(a, int) or not isinstance(b, int):
        return "error: add needs integers a and b"
    return str(a + b)


def _step(messages: list, msg) -> str | None:
    """Append the model's reply (and tool results) to ``messages``; the reply's text when it called no tool."""
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]
                     or [{"type": "text", "text": ""}]})
    uses = [b for b in msg.content if b.type == "tool_use"]
    if uses:
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id, "content": _tool_result(b)} for b in uses]})
        return None
    return " ".join(b.text for b in msg.content if b.type == "text").replace("\n", " ").strip()


async def arun(client: AsyncAnthropic, question: str, model: str) -> str:
    messages: list = [{"role": "user", "content": question}]
    replies: list[str] = []
    for _ in range(MAX_CALLS):
        msg = await client.messages.create(model=model, system=SYSTEM, messages=messages, tools=TOOLS,
                                           max_tokens=MAX_TOKENS[min(len(replies), 1)],
                                           extra_body={"temperature": TEMPERATURE})
        text = _step(messages, msg)
        if text is None:
            continue
        replies.append(text)
        if len(replies) == 2:
            break
        messages.append({"role": "user", "content": FOLLOW_UP.format(question=question)})
    return "\n".join(replies)


async def agent(base_url: str, task: dict, api_key: str, model: str, gateway_url: str | None = None) -> str:
    """Harness entry point for ``harness: {callable: sums_agent:agent}``: the question from the task's seed.
    ``base_url`` is the OpenAI-style ``.../v1``; the Anthropic SDK takes the root (``gateway_url``)."""
    from sums import question

    root = gateway_url or base_url.removesuffix("/v1")
    async with AsyncAnthropic(base_url=root, api_key=api_key, max_retries=2, timeout=300.0) as client:
        return await arun(client, question(int(task["seed"])), model)


async def _main(question: str, model: str) -> str:
    # ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY from the environment
    async with AsyncAnthropic(max_retries=2, timeout=300.0) as client:
        return await arun(client, question, model)


def main() -> int:
    question = sys.stdin.read().strip() or "What is 3 plus 4?"
    print(asyncio.run(_main(question, os.environ.get("ANTHROPIC_MODEL", "smollm2-135m"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
