"""What an agent run's session pipeline needs from the harness layer: the runner that starts one session,
the verifier that scores it, and its task lists. The one place that chooses between a black-box agent
harness (``harness.type: agent``) and the built-in LLM agent on an env harness (``agent.type: llm``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from polar.config.agentic import VerifierConfig
from polar.config.harness import AgentHarnessConfig
from polar.config.llm_agent import LLMAgentConfig
from polar.config.run import AgentRunConfig, EnvRunConfig
from polar.errors import ConfigError
from polar.harness.benchmarks.sources import load_run_tasks

if TYPE_CHECKING:  # the agent harness modules load when a session runner or verifier is built: env runs skip them
    from polar.harness.agent.runners import HarnessRunner
    from polar.harness.agent.verifiers import CheckedVerifier

__all__ = ["agent_timeout_s", "load_run_tasks", "session_runner", "session_verifier"]


def _llm_agent(cfg: AgentRunConfig) -> LLMAgentConfig | None:
    """The built-in LLM agent when it plays an env harness; None for an agent harness (it brings its own agent)."""
    return cfg.agent if cfg.harness.type != "agent" else None


def _agent_harness(cfg: AgentRunConfig) -> AgentHarnessConfig:
    """``cfg.harness`` of an agent run without the LLM agent: validation makes it ``harness.type: agent``."""
    if not isinstance(cfg.harness, AgentHarnessConfig):
        raise ConfigError(f"harness.type {cfg.harness.type!r} in an agent run needs agent: {{type: llm}} (the built-in "
                          "LLM agent plays env harnesses); or use harness.type: agent")
    return cfg.harness


def session_runner(cfg: EnvRunConfig | AgentRunConfig) -> HarnessRunner:
    """The runner of one session of ``cfg``'s agent run."""
    if not isinstance(cfg, AgentRunConfig):
        raise ConfigError(f"harness.type {cfg.harness.type!r} with agent.type {cfg.agent.type!r} is not an "
                          "agent run; "
                          "use harness.type: agent, or agent: {type: llm} on an env harness")
    agent = _llm_agent(cfg)
    if agent is not None:
        from polar.harness.llm_env import build_llm_env_runner

        return build_llm_env_runner(cfg.harness, agent, cfg.config_dir)
    from polar.harness.agent.build import build_runner

    return build_runner(_agent_harness(cfg), cfg.config_dir)


def session_verifier(cfg: AgentRunConfig, config_dir: Path | None = None) -> CheckedVerifier:
    """``cfg.verifier``; for the LLM env agent without one, ``env_return`` (the episode return is the reward). Its
    rewards are checked: NaN, or one outside ``verifier.reward_range``, ends the session ERROR naming the task."""
    from polar.harness.agent.verifiers import checked_verifier

    verifier_cfg = cfg.verifier
    if verifier_cfg is None and _llm_agent(cfg) is not None:
        verifier_cfg = VerifierConfig(type="env_return")
    return checked_verifier(verifier_cfg, config_dir or cfg.config_dir)


def agent_timeout_s(cfg: AgentRunConfig) -> float:
    """The harness's own time limit per session: ``harness.timeout_s``, or the LLM agent's ``agent.timeout_s``."""
    agent = _llm_agent(cfg)
    return agent.timeout_s if agent is not None else _agent_harness(cfg).timeout_s
