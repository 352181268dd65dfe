"""Claude Code (``@anthropic-ai/claude-code``): ``claude -p`` against the gateway's Anthropic Messages API.

Sends streaming ``POST {base}/v1/messages?beta=true`` with thinking, context_management,
output_config, metadata, cache_control and its full tool list.
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


class ClaudeCodePreset(HarnessPreset):
    name = "claude_code"
    package = "@anthropic-ai/claude-code"
    version = "2.1.197"
    binary = "claude"
    api = "anthropic"
    permission_flag = "--dangerously-skip-permissions"
    option_names = ("max_turns", "effort", "append_system_prompt", "allowed_tools", "disallowed_tools", "max_thinking_tokens")

    def args(self, ctx: PresetContext) -> list[str]:
        o = ctx.options
        argv = [
            "-p",
            "--model", ctx.model,
            "--fallback-model", ctx.model,
            "--output-format", "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
        ]
        if o.get("max_turns"):
            argv += ["--max-turns", str(int(o["max_turns"]))]
        if o.get("effort"):
            argv += ["--effort", str(o["effort"])]
        if o.get("append_system_prompt"):
            argv += ["--append-system-prompt", str(o["append_system_prompt"])]
        if o.get("allowed_tools"):
            argv += ["--allowed-tools", ",".join(o["allowed_tools"])]
        if o.get("disallowed_tools"):
            argv += ["--disallowed-tools", ",".join(o["disallowed_tools"])]
        if self.compact(ctx):
            argv += ["--bare", "--system-prompt", self.system_prompt(ctx), "--tools", "Bash", "--disable-slash-commands"]
        elif o.get("system_prompt"):
            argv += ["--system-prompt", str(o["system_prompt"])]
        return [*argv, "--"]

    def env(self, ctx: PresetContext) -> dict[str, str]:
        m = ctx.model
        env = {
            "ANTHROPIC_BASE_URL": ctx.base_url,
            "ANTHROPIC_API_KEY": ctx.api_key,
            "CLAUDE_CONFIG_DIR": str(self.config_dir(ctx)),
            # the CLI refuses --dangerously-skip-permissions as root unless told it is sandboxed
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_BUG_COMMAND": "1",
            "DISABLE_COST_WARNINGS": "1",
            "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
            "CLAUDE_CODE_IDE_SKIP_AUTO_INSTALL": "1",
            # every alias the CLI may pick on its own (sub-agents, haiku side calls, fallbacks)
            "ANTHROPIC_MODEL": m,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": m,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": m,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": m,
            "ANTHROPIC_SMALL_FAST_MODEL": m,
            "CLAUDE_CODE_SUBAGENT_MODEL": m,
        }
        if self.max_output_tokens(ctx) is not None:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(self.max_output_tokens(ctx))
        if ctx.options.get("max_thinking_tokens") is not None:
            env["MAX_THINKING_TOKENS"] = str(int(ctx.options["max_thinking_tokens"]))
        return env

    def config_dir(self, ctx: PresetContext) -> Path:
        return ctx.home / ".claude"

    def write_config(self, ctx: PresetContext, written: list[Path]) -> None:
        # Skip onboarding and the API-key approval prompt: a first run must never wait for a human.
        write_file(
            self.config_dir(ctx) / ".claude.json",
            {
                "hasCompletedOnboarding": True,
                "bypassPermissionsModeAccepted": True,
                "autoUpdates": False,
                "customApiKeyResponses": {"approved": [ctx.api_key[-20:]], "rejected": []},
            },
            written,
        )

    def transcript_globs(self) -> tuple[str, ...]:
        return (".claude/projects/*/*.jsonl",)

    def collect(self, ctx: PresetContext, stdout: bytes, stderr: bytes) -> PresetOutput:
        events = parse_jsonl(stdout)
        final = ""
        for ev in events:
            if ev.get("type") == "result" and isinstance(ev.get("result"), str):
                final = ev["result"]
        if not final:
            for ev in events:
                if ev.get("type") == "assistant":
                    texts = [c.get("text", "") for c in ev.get("message", {}).get("content", []) if c.get("type") == "text"]
                    final = "".join(texts) or final
        return PresetOutput(
            final_text=final,
            transcript=events,
            transcript_files=self.find_transcripts(ctx),
            last_lines=last_lines(stderr + b"\n" + stdout),
        )
