"""Coding-CLI presets: ``harness: {type: agent, preset: claude_code | codex | qwen_code | gemini_cli | pi}``.

Each preset knows its CLI's non-interactive flags, the environment and per-session config files
that point it at the gateway, the model aliases it must pin, and where its transcript lands.
See docs/harnesses.md.
"""

from __future__ import annotations

from polar.errors import ConfigError
from polar.harness.agent.presets.base import (
    HarnessPreset,
    LaunchSpec,
    PresetContext,
    PresetOutput,
    harnesses_dir,
)
from polar.harness.agent.presets.claude_code import ClaudeCodePreset
from polar.harness.agent.presets.codex import CodexPreset
from polar.harness.agent.presets.gemini_cli import GeminiCliPreset
from polar.harness.agent.presets.pi import PiPreset
from polar.harness.agent.presets.qwen_code import QwenCodePreset

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


def npm_specs() -> list[str]:
    """``package@version`` for every preset: what ``make harnesses`` installs."""
    return [f"{p.package}@{p.version}" for p in PRESETS.values()]


__all__ = [
    "PRESETS",
    "HarnessPreset",
    "LaunchSpec",
    "PresetContext",
    "PresetOutput",
    "get_preset",
    "harnesses_dir",
    "npm_specs",
]
