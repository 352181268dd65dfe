"""Qwen Code (``@qwen-code/qwen-code``): ``qwen --yolo`` against the gateway's OpenAI Chat Completions API.

Pointed at the gateway with ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/``OPENAI_MODEL`` (passing ``--model``
as well conflicts); sends streaming ``POST {base}/v1/chat/completions`` with ``stream_options`` and tools.
"""

from __future__ import annotations

from pathlib import Path

from polar.harness.agent.presets.base import (
    HarnessPreset,
    PresetContext,
    PresetOutput,
    last_lines,
    parse_jsonl,
    write_file,
)


class QwenCodePreset(HarnessPreset):
    name = "qwen_code"
    package = "@qwen-code/qwen-code"
    version = "0.15.10"
    binary = "qwen"
    api = "openai_chat"
    permission_flag = "--yolo"
    option_names = ("max_session_turns",)

    def args(self, ctx: PresetContext) -> list[str]:
        argv = ["--yolo", "--output-format", "stream-json", "--auth-type", "openai"]
        if ctx.options.get("max_session_turns"):
            argv += ["--max-session-turns", str(int(ctx.options["max_session_turns"]))]
        if self.compact(ctx):
            argv += ["--bare", "--system-prompt", self.system_prompt(ctx), "--core-tools", "run_shell_command"]
        elif ctx.options.get("system_prompt"):
            argv += ["--system-prompt", str(ctx.options["system_prompt"])]
        return argv

    def prompt_args(self, ctx: PresetContext) -> list[str]:
        return ["--prompt", ctx.instruction]

    def env(self, ctx: PresetContext) -> dict[str, str]:
        env = {}
        if self.max_output_tokens(ctx) is not None:
            env["QWEN_CODE_MAX_OUTPUT_TOKENS"] = str(self.max_output_tokens(ctx))
        return env | {
            "OPENAI_BASE_URL": ctx.base_url + "/v1",
            "OPENAI_API_KEY": ctx.api_key,
            "OPENAI_MODEL": ctx.model,
            "QWEN_CODE_DISABLE_TELEMETRY": "1",
            "GEMINI_TELEMETRY_ENABLED": "false",
            "QWEN_TELEMETRY_ENABLED": "false",
        }

    def write_config(self, ctx: PresetContext, written: list[Path]) -> None:
        write_file(
            ctx.home / ".qwen" / "settings.json",
            {
                "security": {"auth": {"selectedType": "openai"}},
                "selectedAuthType": "openai",
                "model": {"name": ctx.model},
                "privacy": {"usageStatisticsEnabled": False},
                "usageStatisticsEnabled": False,
                "telemetry": {"enabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                "ide": {"enabled": False},
            },
            written,
        )

    def transcript_globs(self) -> tuple[str, ...]:
        return (".qwen/tmp/**/*.json", ".qwen/tmp/**/*.jsonl", ".qwen/projects/**/*.jsonl")

    def collect(self, ctx: PresetContext, stdout: bytes, stderr: bytes) -> PresetOutput:
        events = parse_jsonl(stdout)
        final = ""
        for ev in events:
            if ev.get("type") == "result" and isinstance(ev.get("result"), str):
                final = ev["result"]
        return PresetOutput(
            final_text=final,
            transcript=events,
            transcript_files=self.find_transcripts(ctx),
            last_lines=last_lines(stderr + b"\n" + stdout),
        )
