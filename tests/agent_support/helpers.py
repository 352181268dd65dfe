"""Helpers shared by the agentic tests (fixtures live in conftest.py)."""

import contextlib
import json
import re
import sys
from pathlib import Path

import psutil

HERE = Path(__file__).parent
EXAMPLES = HERE.parent.parent / "examples" / "agentic"


def oracle_script(tokenizer, wrong_every: int = 0):
    """A scripted 'model' that solves calculator tasks: tool call first, then the tool's result.

    With ``wrong_every = k`` every k-th answer is off by one (so rejection sampling has work to do).
    """
    counter = {"n": 0}

    def respond(request, index):
        text = tokenizer.decode(request.prompt_ids)
        results = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", text, re.S)
        if results:
            counter["n"] += 1
            answer = results[-1]
            if wrong_every and counter["n"] % wrong_every == 0 and answer.lstrip("-").isdigit():
                answer = str(int(answer) + 1)
            return answer
        questions = re.findall(r"What is (-?\d+) ([-+*]) (-?\d+)\?", text)
        verbs = re.findall(r"What is (\d+) (squared|doubled|minus 10)\?", text)
        if verbs:  # the calculator example's questions
            n, verb = verbs[-1]
            questions = [{"squared": (n, "*", n), "doubled": (n, "+", n), "minus 10": (n, "-", "10")}[verb]]
        if questions:
            a, op, b = questions[-1]
            return '<tool_call>\n{"name": "calc", "arguments": {"a": %s, "op": "%s", "b": %s}}\n</tool_call>' % (a, op, b)  # noqa: UP031
        return "hello"

    return respond


def alive(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    return False


def calc_tasks(n: int = 4):
    out = []
    for i in range(n):
        a, b = i % 10, (i * 3 + 1) % 10
        out.append({"id": f"t{i}", "prompt": f"What is {a} + {b}?", "answer": str(a + b)})
    return out


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
