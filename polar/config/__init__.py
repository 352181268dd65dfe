"""Typed, strict run configuration."""

from polar.config.base import StrictModel, did_you_mean, validate
from polar.config.loader import apply_overrides, dump_config, load_config, parse_yaml
from polar.config.run import RunConfig

__all__ = ["RunConfig", "StrictModel", "apply_overrides", "did_you_mean", "dump_config", "load_config", "parse_yaml", "validate"]
