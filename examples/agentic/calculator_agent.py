"""A multi-turn, tool-using calculator agent written against the official ``openai`` SDK.

Tool: ``calc(a, op, b)`` with integers ``a``, ``b`` and ``op`` one of ``+ - *``.

It knows nothing about polar: it reads the question on stdin, talks to whatever ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` point at, runs the tool the model asks for, feeds the result back,
and prints the model's final answer on its last stdout line. Run it against any OpenAI-compatible
server:  ``echo "What is 3 + 4?" | OPENAI_BASE_URL=... OPENAI_API_KEY=... python calculator_agent.py``
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys

from openai import AsyncOpenAI, OpenAI

MAX_TURNS = 3
TOOLS = [{"type": "function", "function": {
    "name": "calc", "description": "a op b",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "op": {"type": "string", "enum": ["+", "-", "*"]}, "b": {"type": "integer"}}}}}]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """Integers with + - * only; anything else is an error message the model sees."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError("unsupported expression")

    try:
        return str(ev(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, TypeError, RecursionError) as e:
        return f"error: {e}"


def run(client: OpenAI, question: str, model: str, max_tokens: int = 48) -> str:
    messages: list[dict] = [{"role": "user", "content": question}]
    for _ in range(MAX_TURNS):
        resp = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens, temperature=1.0,
        )
        msg = resp.choices[0].message
        if not msg.tool_calls:
            return (msg.content or "").strip()
        messages.append({
            "role": "assistant", "content": msg.content or "",
            "tool_calls": [tc.model_dump(include={"id", "type", "function"}) for tc in msg.tool_calls],
        })
        for tc in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": _tool_result(tc)})
    return ""


async def arun(client: AsyncOpenAI, question: str, model: str, max_tokens: int = 48) -> str:
    """The same agent on the async client (used as an in-process ``module:function`` harness)."""
    messages: list[dict] = [{"role": "user", "content": question}]
    for _ in range(MAX_TURNS):
        resp = await client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens, temperature=1.0,
        )
        msg = resp.choices[0].message
        if not msg.tool_calls:
            return (msg.content or "").strip()
        messages.append({
            "role": "assistant", "content": msg.content or "",
            "tool_calls": [tc.model_dump(include={"id", "type", "function"}) for tc in msg.tool_calls],
        })
        for tc in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": _tool_result(tc)})
    return ""


def _tool_result(tc) -> str:
    try:
        args = json.loads(tc.function.arguments or "{}")
    except json.JSONDecodeError:
        return "error: arguments are not JSON"
    if tc.function.name != "calc" or not isinstance(args, dict):
        return "error: unknown tool"
    a, op, b = args.get("a"), args.get("op"), args.get("b")
    if not isinstance(a, int) or not isinstance(b, int) or op not in ("+", "-", "*"):
        return "error: need integers a, b and op one of + - *"
    return calculator(f"{a} {op} {b}")


async def agent(base_url: str, task: dict, api_key: str, model: str) -> str:
    """Harness entry point for ``harness: {callable: calculator_agent:agent}``."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=2, timeout=120.0) as client:
        return await arun(client, task["prompt"], model)


def main() -> int:
    question = sys.stdin.read().strip()
    client = OpenAI(max_retries=2, timeout=120.0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    answer = run(client, question, os.environ.get("OPENAI_MODEL", "tiny"))
    print(answer.replace("\n", " "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
