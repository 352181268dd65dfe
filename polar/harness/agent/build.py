"""``harness: {type: agent, ...}`` → the runner that starts one session: a callable, a command, or a
coding-CLI preset. The one place that chooses, so the runner modules do not build each other."""

from __future__ import annotations

from pathlib import Path

from polar.config.harness import AgentHarnessConfig
from polar.errors import ConfigError
from polar.harness.agent.presets import get_preset
from polar.harness.agent.presets.runner import PresetRunner
from polar.harness.agent.process import ProcessLimits
from polar.harness.agent.runners import CallableRunner, CommandRunner, HarnessRunner


def build_runner(harness_cfg: AgentHarnessConfig, config_dir: Path | None = None) -> HarnessRunner:
    """A runner from ``harness: {type: agent, ...}``."""
    if harness_cfg.callable:
        return CallableRunner(harness_cfg.callable, config_dir)
    if harness_cfg.preset:
        return _preset_runner(harness_cfg, harness_cfg.preset, config_dir)
    if not harness_cfg.command:  # the config's validator requires one entry point: an unvalidated config
        raise ConfigError("harness: an agent harness needs exactly one of 'command' (a program), 'callable' "
                          "('module:function') or 'preset'; got none")
    lim = harness_cfg.limits
    return CommandRunner(
        harness_cfg.command,
        env=harness_cfg.env,
        task_input=harness_cfg.task_input,
        task_file=harness_cfg.task_file,
        limits=ProcessLimits(lim.cpu_time_s, lim.memory_mb, lim.open_files, lim.file_size_mb, lim.output_bytes),
        config_dir=config_dir,
        sandbox=harness_cfg.sandbox,
    )


def _preset_runner(harness_cfg: AgentHarnessConfig, preset: str, config_dir: Path | None) -> PresetRunner:
    """The session runner for ``harness: {type: agent, preset: NAME, preset_options: {...}}``.

    Resource limits come from ``harness.limits`` except the address-space limit: V8 and WebAssembly
    reserve tens of GiB of virtual memory they never touch (Gemini CLI dies under a 4 GiB RLIMIT_AS),
    so presets run without one unless ``preset_options.address_space_mb`` asks for it.
    """
    options = dict(harness_cfg.preset_options or {})
    lim = harness_cfg.limits
    limits = ProcessLimits(lim.cpu_time_s, int(options.pop("address_space_mb", 0)), lim.open_files,
                           lim.file_size_mb, lim.output_bytes)
    if harness_cfg.env:
        options["extra_env"] = {**harness_cfg.env, **(options.get("extra_env") or {})}
    return PresetRunner(get_preset(preset), options, limits=limits, config_dir=config_dir)
