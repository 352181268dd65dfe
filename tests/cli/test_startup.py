"""A config error is found before anything is created or heavy is imported: `polar --help` and a config error
load no torch, no transformers (what made every command take 5-10 s), and a mistyped verifier or harness
module leaves no run folder and names the key and the close match."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "ray", "peft", "vllm")
PROBE = textwrap.dedent("""
    import sys
    from polar.cli.main import main
    try:
        rc = main(sys.argv[1:])
    except SystemExit as e:
        rc = e.code
    print("LOADED", ",".join(m for m in %r if m in sys.modules), file=sys.stderr)
    sys.exit(rc)
""") % (HEAVY,)


def polar(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def loaded(p: subprocess.CompletedProcess[str]) -> list[str]:
    (line,) = [line for line in p.stderr.splitlines() if line.startswith("LOADED")]
    return [m for m in line.removeprefix("LOADED").strip().split(",") if m]


AGENT_RUN = """
name: typo
harness: {{type: agent, callable: "{callable}"}}
tasks: tasks.jsonl
verifier: {{type: "{verifier}"}}
model: {{name_or_path: tiny}}
policy: {{type: grpo, kwargs: {{group_size: 2, tasks_per_step: 1, total_steps: 1}}}}
"""


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    (tmp_path / "word_verifier.py").write_text("def verify(output):\n    return 1.0\n")
    (tmp_path / "my_agent.py").write_text("async def agent(base_url, task, api_key):\n    return 'x'\n")
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    return tmp_path


def test_help_imports_no_torch(tmp_path):
    p = polar(tmp_path, "--help")
    assert p.returncode == 0 and "generate" in p.stdout, p.stderr
    assert loaded(p) == []


def test_config_error_imports_no_torch(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: bad\nharness: {type: gymnasium, id: CartPole-v1}\n"
                                       "policy: {type: ppo, kwargs: {learning_rte: 1}}\n")
    p = polar(tmp_path, "run", "--config", "bad.yaml")
    assert p.returncode == 1 and "policy.kwargs.learning_rte" in p.stderr, p.stderr
    assert loaded(p) == []
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("key, callable_, verifier, typo, meant", [
    ("verifier.type", "my_agent:agent", "word_verifer:verify", "word_verifer", "word_verifier"),
    ("harness.callable", "my_agnet:agent", "word_verifier:verify", "my_agnet", "my_agent"),
])
def test_mistyped_module_leaves_no_run_folder(agent_dir, key, callable_, verifier, typo, meant):
    (agent_dir / "run.yaml").write_text(AGENT_RUN.format(callable=callable_, verifier=verifier))
    p = polar(agent_dir, "run", "--config", "run.yaml")
    assert p.returncode == 1, p.stderr
    (error,) = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert key in error and repr(typo) in error and f"did you mean: {meant}" in error, error
    assert not (agent_dir / "runs").exists()
    assert loaded(p) == []


def test_mistyped_verifier_function_names_the_key(agent_dir):
    (agent_dir / "run.yaml").write_text(AGENT_RUN.format(callable="my_agent:agent", verifier="word_verifier:verfy"))
    p = polar(agent_dir, "run", "--config", "run.yaml")
    (error,) = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert "verifier.type" in error and "did you mean: verify" in error, error
    assert not (agent_dir / "runs").exists()


def test_verifier_whose_parameters_polar_never_passes_is_refused_before_the_run_folder(agent_dir):
    """`def verify(task, result)` used to fail every session at its end (TypeError: missing 'result')."""
    (agent_dir / "result_verifier.py").write_text("def verify(task, result):\n    return 1.0\n")
    (agent_dir / "run.yaml").write_text(AGENT_RUN.format(callable="my_agent:agent", verifier="result_verifier:verify"))
    p = polar(agent_dir, "run", "--config", "run.yaml")
    assert p.returncode == 1, p.stderr
    (error,) = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert "verifier.type 'result_verifier:verify'" in error and "'result'" in error, error
    assert "task, output, workspace, records" in error, error
    assert not (agent_dir / "runs").exists()


AGENT_STACK = ("uvicorn", "starlette", "httpx", "polar.rollout.sessions.local", "polar.rollout.sessions.pipeline",
               "polar.harness.agent.build", "polar.harness.agent.runners", "polar.harness.agent.verifiers")
COMPOSE_ENV_RUN = textwrap.dedent("""
    import sys, tempfile
    from polar.config import load_config
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir
    cfg = load_config(sys.argv[1], ["logging.tensorboard=false", "total_env_steps=8"])
    build_trainer(cfg, RunDir.create("startup", tempfile.mkdtemp())).close()
    print("LOADED", ",".join(m for m in %r if m in sys.modules), file=sys.stderr)
""") % (AGENT_STACK,)


def test_env_run_imports_no_agent_stack(tmp_path):
    """A CartPole PPO run composes without the agent-run stack (the session server, the agent harness modules):
    a third of a second of CPU in every run's start-up that a classic-RL run never uses."""
    config = Path(__file__).resolve().parents[2] / "examples" / "cartpole_ppo.yaml"
    p = subprocess.run([sys.executable, "-c", COMPOSE_ENV_RUN, str(config)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert loaded(p) == []
