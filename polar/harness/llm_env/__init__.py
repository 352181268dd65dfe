"""A built-in LLM agent for reset/step envs (``agent: {type: llm}``): each episode is one gateway session."""

from polar.harness.llm_env.runner import LLMEnvRunner, build_llm_env_runner, env_return_verdict

__all__ = ["LLMEnvRunner", "build_llm_env_runner", "env_return_verdict"]
