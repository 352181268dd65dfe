"""The reward designer (issue 37 item 7): sandboxed candidates and the bounded Eureka loop."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polar.harness.agent.sandbox import bwrap_unusable
from polar.inference.chat import chat_function
from polar.inference.scripted import ScriptedEngine
from polar.llm_roles.reward_design import RewardDesignConfig, design_reward, extract_code
from polar.llm_roles.sandboxed_reward import CandidateFailed, SandboxedReward
from tests.sandbox_attacks import HANG, connect_to, home_secret, host_listener, read_from, write_to

pytestmark = pytest.mark.skipif(bool(bwrap_unusable()), reason="needs bubblewrap")

HEAD = "def compute_reward(obs, action, next_obs, terminated, truncated):\n"


def _candidate(tmp_path: Path, body: str) -> SandboxedReward:
    folder = tmp_path / "cand"
    folder.mkdir(mode=0o755)
    (folder / "candidate.py").write_text(body)
    return SandboxedReward(folder, call_timeout_s=3.0)


def _ask(reward: SandboxedReward) -> float:
    try:
        return reward([0.0, 1.0], 1, [0.5, 1.0], False, False)
    finally:
        reward.close()


def test_reward_candidate_answers_from_its_sandbox(tmp_path: Path) -> None:
    assert _ask(_candidate(tmp_path, HEAD + "    return next_obs[0] + action\n")) == 1.5


def _guarded(*statements: str) -> str:
    """A candidate that runs each attack statement and returns how many of them got through."""
    body = HEAD + "    n = 0.0\n"
    for s in statements:
        body += f"    try:\n        {s}\n        n += 1.0\n    except OSError:\n        pass\n"
    return body + "    return n\n"


def test_reward_candidate_cannot_reach_the_network(tmp_path: Path) -> None:
    with host_listener() as (port, connected):
        assert _ask(_candidate(tmp_path, _guarded(connect_to(port)))) == 0.0
        assert not connected(), "the sandboxed candidate connected to a host port"


def test_reward_candidate_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    target = tmp_path / "outside.txt"
    assert _ask(_candidate(tmp_path, _guarded(write_to(target)))) == 0.0
    assert not target.exists()


def test_reward_candidate_cannot_read_the_hosts_home(tmp_path: Path) -> None:
    """A file in the host's home (like ~/.ssh/id_rsa) and one beside the candidate's folder stay unreadable;
    the home may exist in the sandbox only as the empty path down to the interpreter."""
    with home_secret() as secret:
        beside = tmp_path / "secret.txt"
        beside.write_text("hunter2")
        assert _ask(_candidate(tmp_path, _guarded(read_from(secret), read_from(beside)))) == 0.0


def test_reward_candidate_that_hangs_fails_within_its_time_limit(tmp_path: Path) -> None:
    reward = _candidate(tmp_path, HEAD + f"    {HANG}\n")
    t0 = time.monotonic()
    with pytest.raises(CandidateFailed, match="did not answer within"):
        reward.start_timeout_s = 0.0
        _ask(reward)
    assert time.monotonic() - t0 < 10


def test_reward_candidate_that_raises_fails_with_its_error(tmp_path: Path) -> None:
    with pytest.raises(CandidateFailed, match="RuntimeError: boom"):
        _ask(_candidate(tmp_path, HEAD + "    raise RuntimeError('boom')\n"))


def test_reward_reply_without_code_block_is_found() -> None:
    assert extract_code("no code here") is None
    assert extract_code("x\n```python\n" + HEAD + "    return 1.0\n```") == HEAD + "    return 1.0\n"


GOOD = f"Keep it alive.\n```python\n{HEAD}    return 0.0 if terminated else 1.0\n```"
# bad: a high shaped return for falling at once; only a task-metric score (not the shaped return) ranks it low
BAD = f"```python\n{HEAD}    return 500.0 if terminated else -1.0\n```"
CRASH = f"```python\n{HEAD}    raise RuntimeError('boom')\n```"


@pytest.mark.timeout(600)
def test_reward_designer_keeps_the_good_candidate(tmp_path: Path) -> None:
    """Scripted engine: one bad, one crashing, one good candidate, then a reply without code; the good one
    is kept, the crash and the missing code are failed candidates with their reasons, and round 2's
    prompt carries round 1's results."""
    engine = ScriptedEngine.tiny([BAD, CRASH, GOOD, "I cannot write code today."])
    cfg = RewardDesignConfig(env_id="CartPole-v1", description="push a cart to balance a pole; +1 per step upright",
                             rounds=2, candidates_per_round=2, total_env_steps=4096, max_parallel=2)
    result = asyncio.run(design_reward(cfg, chat_function(engine, max_tokens=256), tmp_path))
    by = {(c.round, c.index): c for c in result.candidates}
    assert result.best is not None and result.best.code is not None
    assert "0.0 if terminated else 1.0" in result.best.code
    assert by[(0, 1)].error is not None and "RuntimeError: boom" in by[(0, 1)].error
    assert by[(1, 1)].error is not None and "no ```python code block```" in by[(1, 1)].error
    assert by[(0, 0)].score is not None and result.best.score is not None
    assert result.best.score > by[(0, 0)].score + 10
    feedback = engine.tokenizer.decode(engine.requests[2].prompt_ids)
    assert "FAILED: RuntimeError: boom" in feedback and "score" in feedback


def _polar(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "polar.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_design_reward_cli_records_a_reply_without_code_as_a_failed_candidate(tmp_path: Path) -> None:
    """The tiny random model writes no code block: the candidate fails with its reason, nothing trains, exit 1."""
    (tmp_path / "d.yaml").write_text("env_id: CartPole-v1\ndescription: balance\nrounds: 1\ncandidates_per_round: 1\n"
                                     "max_tokens: 16\nmodel: {name_or_path: tiny}\n")
    res = _polar("design-reward", "--config", "d.yaml", "--out", "out.json", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["best"] is None
    assert "no ```python code block```" in out["candidates"][0]["error"]


def test_design_reward_cli_names_the_bad_config_key(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text("env_id: CartPole-v1\ndescription: x\nrounds: 0\n")
    res = _polar("design-reward", "--config", "d.yaml", cwd=tmp_path)
    assert res.returncode != 0
    assert "rounds" in res.stderr and "greater than or equal to 1" in res.stderr
