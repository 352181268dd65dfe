import asyncio
import signal

import pytest

from polar.config.agentic import VerifierConfig
from polar.errors import ConfigError, HarnessError
from polar.harness.agent.sandbox import bwrap_unusable
from polar.harness.agent.verifiers import (
    ExactMatch,
    Numeric,
    PythonTests,
    Regex,
    UserFunction,
    VerifyInput,
    WorkspaceCheck,
    build_verifier,
    final_answer,
)


def run(v, task, output="", ws=None):
    return asyncio.run(v(VerifyInput(task=task, output=output, workspace=ws)))


def test_final_answer_is_last_line_or_pattern():
    assert final_answer("thinking...\n\n 42 \n") == "42"
    assert final_answer("Answer: 7 then Answer: 9", r"Answer: (\d+)") == "9"
    assert final_answer("nothing", r"Answer: (\d+)") is None


def test_exact_numeric_regex():
    task = {"answer": "12"}
    assert run(ExactMatch(), task, "work\n12").reward == 1.0
    assert run(ExactMatch(), task, "12.0").reward == 0.0
    assert run(Numeric(), task, "the total is 12.0000001").reward == 1.0
    assert run(Numeric(), task, "11.9").reward == 0.0
    assert run(Numeric(), task, "no number").reward == 0.0
    assert run(Regex(r"^\s*{answer}\b"), task, "12 apples").reward == 1.0
    assert run(Regex(r"^{answer}$"), task, "112").reward == 0.0
    with pytest.raises(ConfigError, match="not a valid regex"):
        Regex("(")


def test_missing_answer_field_raises_a_clear_error():
    with pytest.raises(HarnessError, match="needs task field 'answer'"):
        run(ExactMatch(), {"prompt": "x"}, "1")


def test_python_tests_pass_fail_and_limits(tmp_path):
    (tmp_path / "sol.py").write_text("def add(a, b):\n    return a + b\n")
    ok = run(PythonTests(), {"tests": "from sol import add\nassert add(2, 3) == 5\n"}, ws=tmp_path)
    assert ok.reward == 1.0 and ok.details["returncode"] == 0
    if bwrap_unusable() is None:  # the tests ran isolated, as the agent did
        assert ok.details["isolation"]["runtime"] == "bwrap" and ok.details["isolation"]["network"] == "none"
    bad = run(PythonTests(), {"tests": "from sol import add\nassert add(2, 3) == 6\n"}, ws=tmp_path)
    assert bad.reward == 0.0 and "AssertionError" in bad.details["stderr"]
    hog = run(PythonTests(memory_mb=200), {"tests": "x = bytearray(1024 * 1024 * 1024)\n"}, ws=tmp_path)
    assert hog.reward == 0.0 and "MemoryError" in hog.details["stderr"]
    spin = run(PythonTests(cpu_time_s=1), {"tests": "while True: pass\n"}, ws=tmp_path)
    # the CPU limit (SIGXCPU, then SIGKILL) ends it; through bubblewrap the signal is reported as exit 128 + N
    assert spin.reward == 0.0 and spin.details["signal"] in (signal.SIGXCPU, signal.SIGKILL), spin.details


def test_workspace_check(tmp_path):
    (tmp_path / "out.txt").write_text("result: 42\n")
    v = WorkspaceCheck(files={"out.txt": "42", "missing.txt": ""})
    r = run(v, {}, ws=tmp_path)
    assert r.reward == 0.0 and r.details["checks"] == {"out.txt": True, "missing.txt": False}
    assert run(WorkspaceCheck(files={"out.txt": "42"}), {}, ws=tmp_path).reward == 1.0
    with pytest.raises(HarnessError, match="escapes the workspace"):
        run(WorkspaceCheck(files={"../etc/passwd": ""}), {}, ws=tmp_path)


def test_user_function_sync_async_and_bad_return(tmp_path):
    (tmp_path / "myver.py").write_text(
        "async def score(task, output):\n    return {'reward': float(output == task['answer']), 'why': 'eq'}\n"
        "def half(output):\n    return 0.5\n"
        "def bad(output):\n    return 'yes'\n"
    )
    r = run(UserFunction("myver:score", tmp_path), {"answer": "a"}, "a")
    assert r.reward == 1.0 and r.details == {"why": "eq"}
    assert run(UserFunction("myver:half", tmp_path), {}, "x").reward == 0.5
    with pytest.raises(HarnessError, match="return a float"):
        run(UserFunction("myver:bad", tmp_path), {}, "x")
    with pytest.raises(ConfigError, match="did you mean"):
        UserFunction("myver:scor", tmp_path)


def test_build_verifier_from_config():
    assert isinstance(build_verifier(VerifierConfig(type="numeric", kwargs={"rel_tol": 0.1})), Numeric)
    with pytest.raises(ConfigError, match="bad kwargs"):
        build_verifier(VerifierConfig(type="numeric", kwargs={"tolerance": 0.1}))
    with pytest.raises(Exception, match="did you mean: exact_match"):
        VerifierConfig(type="exact_mach")
