"""Verifiers: turn a finished session into a reward (and a record of why).

Every verifier is ``async (VerifyInput) -> Verdict``. Built-ins:

- ``exact_match`` / ``numeric`` / ``regex``: compare the harness's final answer with the task's
  ``answer`` field (``answer_key`` to change it). The final answer is the last non-empty line of the
  harness output unless ``answer_pattern`` (a regex with one group) says otherwise.
- ``python_tests``: run the task's ``tests`` (Python source, e.g. pytest-free asserts or unittest)
  against the workspace in a subprocess with CPU-time/memory limits; reward = 1 if it exits 0.
- ``workspace``: files in the workspace must exist / contain given text (``files: {path: substring}``).
- ``module:function``: a user function ``(task, output, workspace, records) -> float | dict`` (sync or
  async); a dict carries ``reward`` plus anything else worth storing.

A verifier that raises is reported by the pipeline as a session ERROR; it never crashes a run.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.errors import ConfigError, HarnessError
from polar.harness.agent.process import ProcessLimits, run_process


@dataclass
class VerifyInput:
    task: dict[str, Any]
    output: str
    workspace: Path
    records: list[Any] = field(default_factory=list)  # the session's CallRecords
    harness: dict[str, Any] = field(default_factory=dict)  # what the runner collected (presets: transcript, diff)


@dataclass
class Verdict:
    reward: float
    details: dict[str, Any] = field(default_factory=dict)


def final_answer(output: str, pattern: str | None = None) -> str | None:
    """The answer a harness gave: the last match of ``pattern`` (group 1), else its last non-empty line."""
    if pattern:
        matches = re.findall(pattern, output, flags=re.MULTILINE)
        if not matches:
            return None
        last = matches[-1]
        return (last[0] if isinstance(last, tuple) else last).strip()
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else None


def _expected(task: dict[str, Any], key: str) -> Any:
    if key not in task:
        raise HarnessError(f"verifier needs task field {key!r} (task {task.get('id', '?')!r} has {sorted(task)})")
    return task[key]


class ExactMatch:
    def __init__(self, answer_key: str = "answer", answer_pattern: str | None = None, case_sensitive: bool = False) -> None:
        self.answer_key, self.pattern, self.case_sensitive = answer_key, answer_pattern, case_sensitive

    async def __call__(self, inp: VerifyInput) -> Verdict:
        expected = str(_expected(inp.task, self.answer_key)).strip()
        got = final_answer(inp.output, self.pattern)
        norm = (lambda s: s) if self.case_sensitive else str.lower
        ok = got is not None and norm(got) == norm(expected)
        return Verdict(float(ok), {"expected": expected, "got": got})


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class Numeric:
    def __init__(self, answer_key: str = "answer", answer_pattern: str | None = None, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> None:
        self.answer_key, self.pattern, self.rel_tol, self.abs_tol = answer_key, answer_pattern, rel_tol, abs_tol

    async def __call__(self, inp: VerifyInput) -> Verdict:
        expected = float(_expected(inp.task, self.answer_key))
        text = final_answer(inp.output, self.pattern)
        nums = _NUMBER.findall(text.replace(",", "")) if text else []
        got = float(nums[-1]) if nums else None
        ok = got is not None and math.isclose(got, expected, rel_tol=self.rel_tol, abs_tol=self.abs_tol)
        return Verdict(float(ok), {"expected": expected, "got": got})


class Regex:
    """Reward 1 when the final answer matches ``pattern`` (``{answer}`` is replaced by the escaped expected answer)."""

    def __init__(self, pattern: str, answer_key: str = "answer", answer_pattern: str | None = None, whole_output: bool = False) -> None:
        self.pattern, self.answer_key, self.answer_pattern, self.whole_output = pattern, answer_key, answer_pattern, whole_output
        try:
            re.compile(pattern.replace("{answer}", "x"))
        except re.error as e:
            raise ConfigError(f"verifier.kwargs.pattern {pattern!r} is not a valid regex: {e}") from None

    async def __call__(self, inp: VerifyInput) -> Verdict:
        pat = self.pattern
        if "{answer}" in pat:
            pat = pat.replace("{answer}", re.escape(str(_expected(inp.task, self.answer_key))))
        text = inp.output if self.whole_output else (final_answer(inp.output, self.answer_pattern) or "")
        ok = re.search(pat, text, flags=re.MULTILINE) is not None
        return Verdict(float(ok), {"pattern": pat})


class PythonTests:
    """Run the task's test code in a subprocess inside the workspace, under time and memory limits."""

    def __init__(self, tests_key: str = "tests", timeout_s: float = 30.0, memory_mb: int = 1024, cpu_time_s: int = 30) -> None:
        self.tests_key, self.timeout_s = tests_key, timeout_s
        self.limits = ProcessLimits(cpu_time_s=cpu_time_s, memory_mb=memory_mb, open_files=256, file_size_mb=64, output_bytes=200_000)

    async def __call__(self, inp: VerifyInput) -> Verdict:
        code = str(_expected(inp.task, self.tests_key))
        path = inp.workspace / "_polar_tests.py"
        path.write_text(code)
        res = await run_process(
            [sys.executable, "-E", str(path)], cwd=str(inp.workspace), env={"PATH": "/usr/bin:/bin"},
            stdin=None, timeout_s=self.timeout_s, limits=self.limits,
        )
        passed = res.returncode == 0 and not res.timed_out
        return Verdict(float(passed), {
            "returncode": res.returncode, "timed_out": res.timed_out,
            "stdout": res.stdout[-2000:].decode("utf-8", "replace"), "stderr": res.stderr_tail(2000),
        })


class WorkspaceCheck:
    """``files: {relative/path: substring-or-empty}``; reward = fraction of checks that hold (all-or-nothing if ``strict``)."""

    def __init__(self, files: dict[str, str] | None = None, files_key: str = "files", strict: bool = True) -> None:
        self.files, self.files_key, self.strict = files, files_key, strict

    async def __call__(self, inp: VerifyInput) -> Verdict:
        checks = self.files if self.files is not None else _expected(inp.task, self.files_key)
        results = {}
        root = inp.workspace.resolve()
        for rel, needle in checks.items():
            p = (root / rel).resolve()
            if root not in p.parents and p != root:
                raise HarnessError(f"workspace check path {rel!r} escapes the workspace")
            results[rel] = p.is_file() and (not needle or needle in p.read_text(errors="replace"))
        frac = sum(results.values()) / max(1, len(results))
        return Verdict(float(frac == 1.0) if self.strict else frac, {"checks": results})


class UserFunction:
    def __init__(self, spec: str, config_dir: Path | None = None, **kwargs: Any) -> None:
        from polar.harness.agent.runners import import_callable

        self.spec, self.fn, self.kwargs = spec, import_callable(spec, config_dir), kwargs

    async def __call__(self, inp: VerifyInput) -> Verdict:
        args = {"task": inp.task, "output": inp.output, "workspace": inp.workspace, "records": inp.records,
                "harness": inp.harness, **self.kwargs}
        params = inspect.signature(self.fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            args = {k: v for k, v in args.items() if k in params}
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(**args)
        else:
            result = await asyncio.to_thread(self.fn, **args)
        if isinstance(result, dict):
            if "reward" not in result:
                raise HarnessError(f"verifier {self.spec} returned a dict without 'reward': {sorted(result)}")
            return Verdict(float(result["reward"]), {k: v for k, v in result.items() if k != "reward"})
        if isinstance(result, bool | int | float):
            return Verdict(float(result))
        raise HarnessError(f"verifier {self.spec} returned {type(result).__name__}; return a float or a dict with 'reward'")


class NoVerifier:
    async def __call__(self, inp: VerifyInput) -> Verdict:
        return Verdict(0.0, {"note": "no verifier"})


_BUILTIN = {
    "exact_match": ExactMatch, "numeric": Numeric, "regex": Regex, "python_tests": PythonTests,
    "workspace": WorkspaceCheck, "none": NoVerifier,
}


#: Built-in verifiers of the env LLM agent and the benchmarks, which live beside (not below) this module.
_NAMED = {
    "env_return": "polar.harness.llm_env.runner:env_return_verdict",
    "humaneval": "polar.harness.benchmarks.humaneval:verify",
    "reasoning_gym": "polar.harness.benchmarks.reasoning_gym:verify",
    "lm_eval": "polar.harness.benchmarks.lm_eval:verify",
}


def build_verifier(cfg: Any, config_dir: Path | None = None):
    """A verifier from ``verifier: {type, kwargs}`` (``None`` → no reward)."""
    if cfg is None:
        return NoVerifier()
    kind, kwargs = cfg.type, dict(cfg.kwargs)
    kind = _NAMED.get(kind, kind)
    if ":" in kind:
        return UserFunction(kind, config_dir, **kwargs)
    try:
        return _BUILTIN[kind](**kwargs)
    except TypeError as e:
        raise ConfigError(f"verifier {kind!r}: bad kwargs {sorted(kwargs)}: {e}") from None
