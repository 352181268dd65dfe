"""Codex CLI (``@openai/codex``): ``codex exec`` against the gateway's OpenAI Responses API.

Codex has no base-URL variable for a custom provider, so the preset writes ``$CODEX_HOME/config.toml``
with a ``[model_providers.polar]`` table (``wire_api = "responses"``) whose key comes from an env var.
It sends streaming ``POST {base}/v1/responses`` with reasoning, include, prompt_cache_key, client_metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

from polar.harness.agent.presets.base import (
    HarnessPreset,
    PresetContext,
    PresetOutput,
    last_lines,
    parse_jsonl,
    write_file,
)

KEY_VAR = "POLAR_GATEWAY_API_KEY"


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string literal is a valid TOML basic string


class CodexPreset(HarnessPreset):
    name = "codex"
    package = "@openai/codex"
    version = "0.171.0"
    binary = "codex"
    api = "openai_responses"
    permission_flag = "--dangerously-bypass-approvals-and-sandbox"
    option_names = ("reasoning_effort", "context_window")

    def args(self, ctx: PresetContext) -> list[str]:
        return [
            "exec",
            "--skip-git-repo-check",
            "--strict-config",  # a config key this version does not know is an error, not silently ignored
            "--dangerously-bypass-approvals-and-sandbox",
            "--json",
            "--color", "never",
            "-C", str(ctx.workspace),
            "-m", ctx.model,
            "--output-last-message", str(self.last_message_file(ctx)),
            "--",
        ]

    def env(self, ctx: PresetContext) -> dict[str, str]:
        return {
            "CODEX_HOME": str(self.codex_home(ctx)),
            KEY_VAR: ctx.api_key,
            "RUST_LOG": "error",
        }

    def codex_home(self, ctx: PresetContext) -> Path:
        return ctx.home / ".codex"

    def last_message_file(self, ctx: PresetContext) -> Path:
        return ctx.home / "codex-last-message.txt"

    def write_config(self, ctx: PresetContext, written: list[Path]) -> None:
        effort = str(ctx.options.get("reasoning_effort", "low"))
        lines = [
            f"model = {_toml_str(ctx.model)}",
            'model_provider = "polar"',
            f"review_model = {_toml_str(ctx.model)}",  # /review and sub-agents ask for the served model too
            f"model_reasoning_effort = {_toml_str(effort)}",
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "check_for_update_on_startup = false",
            "hide_agent_reasoning = false",
        ]
        if ctx.options.get("context_window"):
            lines.append(f"model_context_window = {int(ctx.options['context_window'])}")
        # Codex has no output-length setting (it sends no max_output_tokens): the gateway's
        # default_max_tokens applies, so ``max_output_tokens`` is not used here.
        compact = self.compact(ctx)
        if compact or ctx.options.get("system_prompt"):
            instructions = write_file(self.codex_home(ctx) / "instructions.md", self.system_prompt(ctx), written)
            lines.append(f"model_instructions_file = {_toml_str(str(instructions))}")
        if compact:
            lines += [
                "include_permissions_instructions = false",
                "include_environment_context = false",
                'web_search = "disabled"',
            ]
        lines += [
            "",
            "[model_providers.polar]",
            'name = "polar gateway"',
            f"base_url = {_toml_str(ctx.base_url + '/v1')}",
            f"env_key = {_toml_str(KEY_VAR)}",
            'wire_api = "responses"',
            "request_max_retries = 1",
            "stream_max_retries = 1",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[otel]",
            'exporter = "none"',
            "",
            "[features]",
            "shell_snapshot = false",
            *(
                [f"{f} = false" for f in ("view_image", "multi_agent", "goals", "image_generation", "apps", "plugins", "skill_search")]
                if compact
                else []
            ),
            "",
            "[skills.bundled]",
            f"enabled = {'false' if compact else 'true'}",
            "",
            "[history]",
            'persistence = "save-all"',
            "",
        ]
        write_file(self.codex_home(ctx) / "config.toml", "\n".join(lines), written)

    def transcript_globs(self) -> tuple[str, ...]:
        return (".codex/sessions/**/*.jsonl",)

    def collect(self, ctx: PresetContext, stdout: bytes, stderr: bytes) -> PresetOutput:
        events = parse_jsonl(stdout)
        final = ""
        last = self.last_message_file(ctx)
        if last.is_file():
            final = last.read_text(errors="replace")
        if not final:
            for ev in events:
                item = ev.get("item") or {}
                if ev.get("type") == "item.completed" and item.get("type") == "agent_message":
                    final = item.get("text", "") or final
        return PresetOutput(
            final_text=final,
            transcript=events,
            transcript_files=self.find_transcripts(ctx),
            last_lines=last_lines(stderr + b"\n" + stdout),
        )
