"""Gemini CLI (``@google/gemini-cli``): ``gemini -p`` against the gateway's Gemini API.

Pointed at the gateway with ``GOOGLE_GEMINI_BASE_URL``/``GEMINI_API_KEY``; needs ``~/.gemini/settings.json``
selecting API-key auth ("Invalid auth method selected" otherwise) and ``GEMINI_CLI_TRUST_WORKSPACE``
("not running in a trusted directory" otherwise). Sends ``POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse``.
"""

from __future__ import annotations

import json
from pathlib import Path

from polar.harness.agent.presets.base import (
    HarnessPreset,
    PresetContext,
    PresetOutput,
    last_lines,
    write_file,
)


class GeminiCliPreset(HarnessPreset):
    name = "gemini_cli"
    package = "@google/gemini-cli"
    version = "0.61.0"
    binary = "gemini"
    api = "gemini"
    permission_flag = "--yolo"
    # Utility calls (routing, next-speaker and loop checks, compression) name these models on their
    # own; the settings below pin what can be pinned, the gateway aliases the rest.
    extra_model_names = (
        "gemini-2.5-flash-lite",
        "gemini-2.5-flash",
        "gemini-2.5-pro",
        "gemini-3-flash-preview",
        "gemini-3-pro-preview",
        "gemini-flash-latest",
        "gemini-flash-lite-latest",
    )

    def args(self, ctx: PresetContext) -> list[str]:
        return ["-m", ctx.model, "--yolo", "--output-format", "json"]

    def prompt_args(self, ctx: PresetContext) -> list[str]:
        return ["-p", ctx.instruction]

    # ``max_output_tokens`` has no Gemini CLI knob: it sends no maxOutputTokens, so the gateway's
    # ``default_max_tokens`` applies.

    def system_md(self, ctx: PresetContext) -> Path:
        return ctx.home / ".gemini" / "system.md"

    def env(self, ctx: PresetContext) -> dict[str, str]:
        env = {}
        if self.compact(ctx) or ctx.options.get("system_prompt"):
            env["GEMINI_SYSTEM_MD"] = str(self.system_md(ctx))  # replaces the built-in system prompt
        return env | {
            "GOOGLE_GEMINI_BASE_URL": ctx.base_url,
            "GEMINI_API_KEY": ctx.api_key,
            "GEMINI_MODEL": ctx.model,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_TELEMETRY_ENABLED": "false",
            "GEMINI_CLI_NO_RELAUNCH": "true",
        }

    def write_config(self, ctx: PresetContext, written: list[Path]) -> None:
        settings: dict = {}
        if self.compact(ctx):
            settings["tools"] = {"core": ["run_shell_command"]}
        if self.compact(ctx) or ctx.options.get("system_prompt"):
            write_file(self.system_md(ctx), self.system_prompt(ctx), written)
        write_file(
            ctx.home / ".gemini" / "settings.json",
            settings | {
                "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
                "selectedAuthType": "gemini-api-key",
                "model": {"name": ctx.model},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                "ide": {"enabled": False},
            },
            written,
        )

    def transcript_globs(self) -> tuple[str, ...]:
        return (".gemini/tmp/**/*.json", ".gemini/tmp/**/*.jsonl")

    def collect(self, ctx: PresetContext, stdout: bytes, stderr: bytes) -> PresetOutput:
        text = stdout.decode("utf-8", "replace")
        final, transcript = "", []
        start = text.find("{")
        if start >= 0:
            try:
                obj = json.loads(text[start:])
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                transcript = [obj]
                final = obj.get("response") or ""
        return PresetOutput(
            final_text=final,
            transcript=transcript,
            transcript_files=self.find_transcripts(ctx),
            last_lines=last_lines(stderr + b"\n" + stdout),
        )
