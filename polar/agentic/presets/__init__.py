"""Coding-CLI presets: ``harness: {type: agent, preset: claude_code | codex | qwen_code | gemini_cli | pi}``.

Each preset knows its CLI's non-interactive flags, the environment and per-session config files
that point it at the gateway, the model aliases it must pin, and where its transcript lands.
See docs/harnesses.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polar.agentic.presets.base import HarnessPreset, LaunchSpec, PresetContext, PresetOutput, harnesses_dir
from polar.agentic.presets.claude_code import ClaudeCodePreset
from polar.agentic.presets.codex import CodexPreset
from polar.agentic.presets.gemini_cli import GeminiCliPreset
from polar.agentic.presets.pi import PiPreset
from polar.agentic.presets.qwen_code import QwenCodePreset
from polar.errors import ConfigError

PRESETS: dict[str, type[HarnessPreset]] = {
    p.name: p for p in (ClaudeCodePreset, CodexPreset, QwenCodePreset, GeminiCliPreset, PiPreset)
}


def get_preset(name: str) -> HarnessPreset:
    """The preset called ``name``; an unknown name fails with the list of presets."""
    try:
        return PRESETS[name]()
    except KeyError:
        from polar.config.base import did_you_mean

        raise ConfigError(
            f"harness.preset: unknown preset {name!r}{did_you_mean(name, list(PRESETS))}; "
            f"choose one of {', '.join(PRESETS)}"
        ) from None


def build_runner(harness_cfg: Any, config_dir: Path | None = None) -> Any:
    """The session runner for ``harness: {type: agent, preset: NAME, preset_options: {...}}``.

    Resource limits come from ``harness.limits`` except the address-space limit: V8 and WebAssembly
    reserve tens of GiB of virtual memory they never touch (Gemini CLI dies under a 4 GiB RLIMIT_AS),
    so presets run without one unless ``preset_options.address_space_mb`` asks for it.
    """
    from polar.agentic.presets.runner import PresetRunner
    from polar.agentic.process import ProcessLimits

    options = dict(harness_cfg.preset_options or {})
    lim = harness_cfg.limits
    limits = ProcessLimits(lim.cpu_time_s, int(options.pop("address_space_mb", 0)), lim.open_files,
                           lim.file_size_mb, lim.output_bytes)
    if harness_cfg.env:
        options["extra_env"] = {**harness_cfg.env, **(options.get("extra_env") or {})}
    return PresetRunner(get_preset(harness_cfg.preset), options, limits=limits, config_dir=config_dir)


def npm_specs() -> list[str]:
    """``package@version`` for every preset: what ``make harnesses`` installs."""
    return [f"{p.package}@{p.version}" for p in PRESETS.values()]


__all__ = [
    "PRESETS",
    "HarnessPreset",
    "LaunchSpec",
    "PresetContext",
    "PresetOutput",
    "build_runner",
    "get_preset",
    "harnesses_dir",
    "npm_specs",
]
