"""Typed, strict run configuration: ``RunConfig`` is an env run or an agent run (``cfg.kind``)."""

from polar.config.base import StrictModel, did_you_mean, validate
from polar.config.loader import apply_overrides, dump_config, load_config, parse_yaml
from polar.config.run import AgentRunConfig, EnvRunConfig, RunConfig, run_kind_of, validate_run_config

__all__ = ["AgentRunConfig", "EnvRunConfig", "RunConfig", "StrictModel", "apply_overrides", "did_you_mean",
           "dump_config", "load_config", "parse_yaml", "run_kind_of", "validate", "validate_run_config"]
