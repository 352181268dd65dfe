"""An LLM as code generator: it writes a connector, ``polar check`` judges it, the output goes back.

Each attempt, the engine gets the description (and, after a failure, the code it wrote and the check's
output) and replies with one Python code block defining the connector class ``class_name``. The code is
written to a fresh folder and ``polar check module:Class`` runs on it **in bubblewrap** (read-only system,
interpreter and polar package, no network, only that folder writable, ``nobody`` as root, CPU/memory/file
limits, a wall-clock limit): the generated code never runs in polar's process. The loop ends at the first
connector that passes, or after ``max_attempts``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polar
from polar.errors import HarnessError
from polar.harness.agent.isolation import interpreter_paths
from polar.harness.agent.process import ProcessLimits, run_process
from polar.harness.agent.sandbox import NOBODY, bwrap_args, bwrap_unusable, setpriv_args
from polar.llm_roles.reward_design import _BLOCK

Ask = Callable[[list[dict[str, str]]], Awaitable[str]]
MODULE = "generated_connector"

SYSTEM = ("You write polar connectors: a Python class with action_space and observation_space (gymnasium.spaces), "
          "__init__(self, config: dict), reset(self, seed=None) -> obs, step(self, action) -> (obs, reward, "
          "terminated, truncated, info), close(self). Reply with exactly one Python code block.")


def extract_block(reply: str) -> str | None:
    """The first fenced code block of ``reply``, or None."""
    blocks = _BLOCK.findall(reply)
    return str(blocks[0]) if blocks else None


@dataclass
class Attempt:
    index: int
    code: str | None
    passed: bool = False
    output: str = ""
    error: str | None = None


@dataclass
class CodegenResult:
    passed: Attempt | None
    attempts: list[Attempt] = field(default_factory=list)
    folder: Path | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"passed": asdict(self.passed) if self.passed else None,
                "attempts": [asdict(a) for a in self.attempts], "folder": str(self.folder) if self.folder else None}


def build_prompt(description: str, class_name: str, history: list[Attempt]) -> list[dict[str, str]]:
    lines = [f"Write a polar connector class named {class_name}.", f"Description: {description}"]
    if history:
        last = history[-1]
        lines += ["Your previous attempt failed.", f"```python\n{(last.code or '').strip()}\n```",
                  f"What failed:\n{last.error or ''}\n{last.output[-3000:]}", "Fix it and reply with the whole file."]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


async def check_in_sandbox(folder: Path, class_name: str, *, steps: int = 100, timeout_s: float = 120.0,
                           memory_mb: int = 2048) -> tuple[bool, str]:
    """Run ``polar check generated_connector:<class_name>`` on ``folder`` in bubblewrap: (passed, output)."""
    why = bwrap_unusable()
    if why:
        raise HarnessError(f"polar check of generated code: bubblewrap cannot run here ({why}); generated code is "
                           "only run sandboxed, so install bubblewrap (apt-get install bubblewrap)")
    root = str(Path(polar.__file__).resolve().parent.parent)  # the checkout polar is imported from
    pkg = str(Path(polar.__file__).resolve().parent)
    uid = NOBODY if os.geteuid() == 0 else None
    if uid is not None:
        for p in [folder, *folder.iterdir()]:
            os.lchown(p, uid, uid)
    inner = ["/usr/bin/env", f"PYTHONPATH={folder}:{root}", sys.executable,
             "-B", "-m", "polar.cli.main", "check", f"{MODULE}:{class_name}", "--steps", str(steps)]
    if uid is not None:
        inner = [*setpriv_args(uid), *inner]
    argv = bwrap_args(rw=[str(folder)], ro=[pkg, *interpreter_paths()], unshare_net=True, chdir=str(folder)) + inner
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "NO_COLOR": "1", "COLUMNS": "200"}
    res = await run_process(argv, cwd=str(folder), env=env, stdin=None, timeout_s=timeout_s,
                            limits=ProcessLimits(cpu_time_s=int(timeout_s) + 5, memory_mb=memory_mb,
                                                 file_size_mb=64, output_bytes=200_000))
    out = (res.stdout.decode("utf-8", "replace") + "\n" + res.stderr.decode("utf-8", "replace")).strip()
    if res.timed_out:
        return False, f"polar check did not finish within {timeout_s:.0f}s (hang?)\n{out[-2000:]}"
    return res.returncode == 0, out[-4000:]


async def generate_connector(description: str, ask: Ask, *, class_name: str = "GeneratedConnector",
                             max_attempts: int = 3, workdir: Path | None = None, steps: int = 100,
                             timeout_s: float = 120.0) -> CodegenResult:
    """Bounded generate → ``polar check`` (sandboxed) → repair loop; the first passing connector is kept."""
    work = Path(workdir or tempfile.mkdtemp(prefix="polar-codegen-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o755)
    history: list[Attempt] = []
    for i in range(max_attempts):
        reply = await ask(build_prompt(description, class_name, history))
        code = extract_block(reply)
        attempt = Attempt(i, code)
        history.append(attempt)
        if code is None:
            attempt.error = "the engine's reply has no ```python code block```"
            continue
        folder = work / f"attempt{i}"
        folder.mkdir(mode=0o755)
        (folder / f"{MODULE}.py").write_text(code)
        attempt.passed, attempt.output = await check_in_sandbox(folder, class_name, steps=steps, timeout_s=timeout_s)
        if attempt.passed:
            return CodegenResult(attempt, history, folder)
        attempt.error = "polar check failed"
    return CodegenResult(None, history)
