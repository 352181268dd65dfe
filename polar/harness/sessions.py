"""What an agent run's session pipeline needs from the harness layer: the runner that starts one session,
the verifier that scores it, and its task lists. The one place that chooses between a black-box agent
harness (``harness.type: agent``) and the built-in LLM agent on an env harness (``agent.type: llm``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar.config.agentic import VerifierConfig
from polar.config.llm_agent import LLMAgentConfig, is_agent_run
from polar.errors import ConfigError
from polar.harness.agent.build import build_runner
from polar.harness.agent.runners import HarnessRunner
from polar.harness.agent.verifiers import checked_verifier
from polar.harness.benchmarks.sources import load_run_tasks

__all__ = ["agent_timeout_s", "load_run_tasks", "session_runner", "session_verifier"]


def _llm_agent(cfg: Any) -> bool:
    return isinstance(cfg.agent, LLMAgentConfig) and cfg.harness.type != "agent"


def session_runner(cfg: Any) -> HarnessRunner:
    """The runner of one session of ``cfg``'s agent run."""
    if not is_agent_run(cfg):
        raise ConfigError(f"harness.type {cfg.harness.type!r} with agent.type {getattr(cfg.agent, 'type', None)!r} is not an "
                          "agent run; "
                          "use harness.type: agent, or agent: {type: llm} on an env harness")
    if _llm_agent(cfg):
        from polar.harness.llm_env import build_llm_env_runner

        return build_llm_env_runner(cfg.harness, cfg.agent, cfg.config_dir)
    return build_runner(cfg.harness, cfg.config_dir)


def session_verifier(cfg: Any, config_dir: Path | None = None) -> Any:
    """``cfg.verifier``; for the LLM env agent without one, ``env_return`` (the episode return is the reward). Its
    rewards are checked: NaN, or one outside ``verifier.reward_range``, ends the session ERROR naming the task."""
    verifier_cfg = cfg.verifier
    if verifier_cfg is None and _llm_agent(cfg):
        verifier_cfg = VerifierConfig(type="env_return")
    return checked_verifier(verifier_cfg, config_dir or cfg.config_dir)


def agent_timeout_s(cfg: Any) -> float:
    """The harness's own time limit per session: ``harness.timeout_s``, or the LLM agent's ``agent.timeout_s``."""
    return cfg.agent.timeout_s if _llm_agent(cfg) else cfg.harness.timeout_s
