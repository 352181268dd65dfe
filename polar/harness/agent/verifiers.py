"""Verifiers: turn a finished session into a reward (and a record of why).

Every verifier is ``async (VerifyInput) -> Verdict``. Built-ins:

- ``exact_match`` / ``numeric`` / ``regex``: compare the harness's final answer with the task's
  ``answer`` field (``answer_key`` to change it). The final answer is the last non-empty line of the
  harness output unless ``answer_pattern`` (a regex with one group) says otherwise.
- ``python_tests``: run the task's ``tests`` (Python source, e.g. pytest-free asserts or unittest)
  against a copy of the workspace, isolated as the agent was (:mod:`polar.harness.agent.isolation`);
  reward = 1 if the tests run to their end and exit 0.
- ``workspace``: files in the workspace must exist / contain given text (``files: {path: substring}``).
- ``llm_judge``: an LLM scores the session (a JSON score, a rubric, or pairwise against a reference), its
  transcript fenced and quoted (:mod:`polar.harness.agent.judge`).
- ``module:function``: a user function ``(task, output, workspace, records) -> float | dict`` (sync or
  async); a dict carries ``reward`` plus anything else worth storing. One that runs the workspace's code
  should take ``trusted_workspace`` and run it in a :class:`~polar.harness.agent.isolation.VerifySandbox`.

``trusted_workspace`` (the verifier config's key, default false): whether a verifier that runs the
workspace's code may run it unisolated where bubblewrap cannot work. Off, it refuses.

A verifier that raises is reported by the pipeline as a session ERROR; it never crashes a run.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polar.errors import ConfigError, HarnessError
from polar.harness.agent.isolation import VerifySandbox, WorkspaceRefused, read_untrusted, require_isolation
from polar.harness.agent.judge import LLMJudge

if TYPE_CHECKING:
    from polar.config.agentic import VerifierConfig

log = logging.getLogger(__name__)


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


#: What scores a session: a built-in verifier, a user's ``module:function``, or the LLM judge.
Verifier = Callable[[VerifyInput], Awaitable[Verdict]]


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
    """Run the task's test code against a copy of the workspace, isolated as the agent was (bubblewrap, no
    network, ``nobody``, limits: :mod:`polar.harness.agent.isolation`); reward 1 when the tests run to their
    end and exit 0. The workspace's code is untrusted: without bubblewrap this refuses unless
    ``trusted_workspace`` is set."""

    def __init__(self, tests_key: str = "tests", timeout_s: float = 30.0, memory_mb: int = 1024, cpu_time_s: int = 30,
                 max_processes: int = 64, file_size_mb: int = 64, trusted_workspace: bool = False) -> None:
        self.tests_key, self.timeout_s, self.trusted_workspace = tests_key, timeout_s, trusted_workspace
        self.memory_mb, self.cpu_time_s, self.max_processes, self.file_size_mb = memory_mb, cpu_time_s, max_processes, file_size_mb
        require_isolation("python_tests", trusted_workspace)  # refuse when the run is built, not session by session

    async def __call__(self, inp: VerifyInput) -> Verdict:
        code = str(_expected(inp.task, self.tests_key))
        with VerifySandbox("python_tests", trusted_workspace=self.trusted_workspace, timeout_s=self.timeout_s,
                           cpu_time_s=self.cpu_time_s, memory_mb=self.memory_mb, file_size_mb=self.file_size_mb,
                           max_processes=self.max_processes) as box:
            try:
                copied = box.copy_in(Path(inp.workspace))
            except WorkspaceRefused as e:
                return Verdict(0.0, {"refused": str(e), "isolation": box.isolation})
            tests = box.write_polar_file("_polar_tests.py", code)
            run = await box.run("script", [str(tests)])
        passed = run.completed and run.exit_code == 0 and run.how in ("completed", "exit")
        details = {**run.details(), "copy": copied.as_dict()}
        if run.how == "exit-from-workspace":
            details["why"] = "the workspace's code raised SystemExit itself: not a pass"
        elif (why := run.why_not()) is not None:
            details["why"] = why
        return Verdict(float(passed), details)


class WorkspaceCheck:
    """``files: {relative/path: substring-or-empty}``; reward = fraction of checks that hold (all-or-nothing if ``strict``).

    It only reads files, never runs them. A path in the config that leaves the workspace is a config
    error; a link the agent planted that leads out of it, a FIFO or a file over ``max_file_mb`` fails its check."""

    def __init__(self, files: dict[str, str] | None = None, files_key: str = "files", strict: bool = True,
                 max_file_mb: int = 16) -> None:
        self.files, self.files_key, self.strict, self.max_bytes = files, files_key, strict, max_file_mb << 20

    async def __call__(self, inp: VerifyInput) -> Verdict:
        checks = self.files if self.files is not None else _expected(inp.task, self.files_key)
        results = {}
        root = inp.workspace.resolve()
        for rel, needle in checks.items():
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise HarnessError(f"workspace check path {rel!r} escapes the workspace; give a path relative to it")
            p = (root / rel).resolve()
            data = read_untrusted(p, self.max_bytes) if root in p.parents else None  # a link out of it: failed
            results[rel] = data is not None and (not needle or needle in data.decode("utf-8", "replace"))
        frac = sum(results.values()) / max(1, len(results))
        return Verdict(float(frac == 1.0) if self.strict else frac, {"checks": results})


VERIFIER_ARGS = ("task", "output", "workspace", "records", "harness", "trusted_workspace")


def check_verifier_signature(fn: Any, spec: str, kwargs: dict[str, Any]) -> None:
    """A required parameter polar never passes would fail every session at its end; say so at the start."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    given = {*VERIFIER_ARGS, *kwargs}
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in given
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if missing:
        raise ConfigError(
            f"verifier.type {spec!r}: its parameter(s) {', '.join(map(repr, missing))} are never passed; polar "
            f"calls it by name with any of {', '.join(VERIFIER_ARGS)} (and verifier.kwargs): rename them, e.g. "
            f"def {spec.rpartition(':')[2]}(task, output) (docs/agentic.md, Verifiers)")


class UserFunction:
    def __init__(self, spec: str, config_dir: Path | None = None, trusted_workspace: bool = False, **kwargs: Any) -> None:
        from polar.harness.agent.runners import import_callable

        self.spec, self.fn, self.kwargs = spec, import_callable(spec, config_dir), kwargs
        self.trusted_workspace = trusted_workspace
        check_verifier_signature(self.fn, spec, kwargs)

    async def __call__(self, inp: VerifyInput) -> Verdict:
        args = {"task": inp.task, "output": inp.output, "workspace": inp.workspace, "records": inp.records,
                "harness": inp.harness, "trusted_workspace": self.trusted_workspace, **self.kwargs}
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


class LLMJudgeVerifier(LLMJudge):
    """``llm_judge``: :class:`~polar.harness.agent.judge.LLMJudge` as a verifier."""

    async def __call__(self, inp: VerifyInput) -> Verdict:
        reward, details = await self.judge(inp)
        return Verdict(reward, details)


class NoVerifier:
    async def __call__(self, inp: VerifyInput) -> Verdict:
        return Verdict(0.0, {"note": "no verifier"})


_BUILTIN = {
    "exact_match": ExactMatch, "numeric": Numeric, "regex": Regex, "python_tests": PythonTests,
    "workspace": WorkspaceCheck, "none": NoVerifier, "llm_judge": LLMJudgeVerifier,
}

#: Built-ins that run the workspace's code (and so take ``trusted_workspace``).
_RUNS_CODE = frozenset({"python_tests"})


#: Built-in verifiers of the env LLM agent and the benchmarks, which live beside (not below) this module.
_NAMED = {
    "env_return": "polar.harness.llm_env.runner:env_return_verdict",
    "humaneval": "polar.harness.benchmarks.humaneval:verify",
    "reasoning_gym": "polar.harness.benchmarks.reasoning_gym:verify",
    "lm_eval": "polar.harness.benchmarks.lm_eval:verify",
}


class CheckedVerifier:
    """A verifier whose reward is checked before anyone averages it: NaN or infinity always, and a value outside
    ``reward_range`` when the config gives one (``[0, 1]``: the reward is a success rate), raise a
    ``HarnessError`` naming the task, so the session ends ERROR with that line instead of being scored."""

    def __init__(self, inner: Verifier, name: str, reward_range: tuple[float, float] | None = None) -> None:
        self.inner, self.name, self.reward_range = inner, name, reward_range
        self._warned: set[str] = set()  # the log names each bad task once; every session still ends ERROR

    async def __call__(self, inp: VerifyInput) -> Verdict:
        verdict: Verdict = await self.inner(inp)
        reward = float(verdict.reward)
        task_id = str(inp.task.get("id", "?"))
        problem = None
        if not math.isfinite(reward):
            problem = (f"verifier {self.name} returned {reward} for task {task_id!r}; a reward must be a finite "
                       "number (fix the verifier: a 0/0 or a failed parse is the usual cause)")
        elif self.reward_range is not None and not self.reward_range[0] <= reward <= self.reward_range[1]:
            low, high = self.reward_range
            problem = (f"verifier {self.name} returned {reward:g} for task {task_id!r}, outside verifier.reward_range "
                       f"[{low:g}, {high:g}]; fix the verifier, or widen reward_range")
        if problem is not None:
            if task_id not in self._warned:
                self._warned.add(task_id)
                log.warning("%s (the session ends ERROR and is neither trained on nor averaged)", problem)
            raise HarnessError(problem)
        return verdict


def checked_verifier(cfg: VerifierConfig | None, config_dir: Path | None = None) -> CheckedVerifier:
    """``build_verifier`` with its rewards checked (``CheckedVerifier``, ``verifier.reward_range``): what a run
    scores its sessions with."""
    rng = cfg.reward_range if cfg is not None else None
    return CheckedVerifier(build_verifier(cfg, config_dir), str(cfg.type) if cfg is not None else "none",
                           (float(rng[0]), float(rng[1])) if rng is not None else None)


def build_verifier(cfg: VerifierConfig | None, config_dir: Path | None = None) -> Verifier:
    """A verifier from ``verifier: {type, kwargs}`` (``None`` → no reward)."""
    if cfg is None:
        return NoVerifier()
    kind, kwargs = cfg.type, dict(cfg.kwargs)
    kind = _NAMED.get(kind, kind)
    trusted = cfg.trusted_workspace
    if ":" in kind:
        return UserFunction(kind, config_dir, trusted_workspace=trusted, **kwargs)
    if kind in _RUNS_CODE:
        kwargs.setdefault("trusted_workspace", trusted)
    try:
        return _BUILTIN[kind](**kwargs)
    except TypeError as e:
        raise ConfigError(f"verifier {kind!r}: bad kwargs {sorted(kwargs)}: {e}") from None
