"""The code generator (issue 37 item 8): an engine writes a connector, sandboxed `polar check` judges it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from polar.harness.agent.sandbox import bwrap_unusable
from polar.inference.chat import chat_function
from polar.inference.scripted import ScriptedEngine
from polar.llm_roles.codegen import CodegenResult, generate_connector
from tests.sandbox_attacks import HANG, connect_to, home_secret, host_listener, read_from, write_to

pytestmark = pytest.mark.skipif(bool(bwrap_unusable()), reason="needs bubblewrap")

CONNECTOR = '''```python
import numpy as np
from gymnasium import spaces


class GeneratedConnector:
    action_space = spaces.Discrete(2)
    observation_space = spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)

    def __init__(self, config):
        self.t = 0
        INIT

    def reset(self, seed=None):
        self.t = 0
        return np.zeros(SIZE, dtype=np.float32)

    def step(self, action):
        self.t += 1
        return np.zeros(SIZE, dtype=np.float32), 0.0, self.t >= 10, False, {}

    def close(self):
        pass
```'''


def connector(size: int = 3, init: str = "pass") -> str:
    return CONNECTOR.replace("SIZE", str(size)).replace("INIT", init)


def _run(replies: list[str], tmp_path: Path, max_attempts: int = 3,
         timeout_s: float = 120.0) -> tuple[ScriptedEngine, CodegenResult]:
    engine = ScriptedEngine.tiny(replies)
    result = asyncio.run(generate_connector("a 3-float counter env with 2 actions", chat_function(engine, max_tokens=512),
                                            max_attempts=max_attempts, workdir=tmp_path, steps=30, timeout_s=timeout_s))
    return engine, result


def test_codegen_repairs_a_broken_connector_from_polar_checks_output(tmp_path: Path) -> None:
    engine, result = _run([connector(size=4), connector(size=3)], tmp_path)
    assert [a.passed for a in result.attempts] == [False, True]
    assert result.passed is not None and result.folder is not None
    assert "has shape (1, 4), expected (1, 3)" in result.attempts[0].output
    second_prompt = engine.tokenizer.decode(engine.requests[1].prompt_ids)
    assert "expected (1, 3)" in second_prompt  # the check's output went back to the engine
    assert (result.folder / "generated_connector.py").read_text().count("np.zeros(3") == 2


def test_af_unix_path_too_long_a_good_connector_in_a_deep_working_folder_passes_polar_check(tmp_path: Path) -> None:
    """The sandbox's /tmp was not writable by ``nobody``, so the connector's socket went into the working
    folder, and a folder path over ~60 characters failed a good connector with "AF_UNIX path too long"."""
    deep = tmp_path / ("d" * 50) / ("e" * 50)
    deep.mkdir(parents=True)
    assert len(str(deep / "attempt0")) > 100
    _, result = _run([connector()], deep, max_attempts=1)
    assert result.passed is not None, result.attempts[0].output
    assert "conforms" in result.passed.output and result.folder == deep / "attempt0"


def test_codegen_reply_without_code_block_is_a_failed_attempt_and_the_loop_goes_on(tmp_path: Path) -> None:
    _, result = _run(["Sure! Here is the idea, no code.", connector()], tmp_path)
    assert result.attempts[0].error is not None and "no ```python code block```" in result.attempts[0].error
    assert result.passed is not None and result.passed.index == 1


def test_codegen_is_bounded(tmp_path: Path) -> None:
    _, result = _run([connector(size=4)] * 2, tmp_path, max_attempts=2)
    assert result.passed is None and len(result.attempts) == 2


def test_generated_connector_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    target = tmp_path.parent / f"{tmp_path.name}-pwned.txt"
    _, result = _run([connector(init=write_to(target))], tmp_path, max_attempts=1)
    assert not target.exists()
    assert result.passed is None  # the write raised inside the sandbox: a failed attempt


def test_generated_connector_cannot_reach_the_network(tmp_path: Path) -> None:
    with host_listener() as (port, connected):
        _run([connector(init=connect_to(port))], tmp_path, max_attempts=1)
        assert not connected(), "the generated connector connected to a host port"


def test_generated_connector_cannot_read_the_hosts_home(tmp_path: Path) -> None:
    with home_secret() as secret:
        _, result = _run([connector(init=read_from(secret))], tmp_path, max_attempts=1)
    assert result.passed is None
    assert "No such file or directory" in result.attempts[0].output or "Permission denied" in result.attempts[0].output


def test_generated_connector_that_hangs_fails_within_its_time_limit(tmp_path: Path) -> None:
    t0 = time.monotonic()
    _, result = _run([connector(init=HANG)], tmp_path, max_attempts=1, timeout_s=20.0)
    assert result.passed is None
    assert time.monotonic() - t0 < 90
