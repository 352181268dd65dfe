"""Pi (``@mariozechner/pi-coding-agent``): ``pi --print`` against the gateway's OpenAI Chat Completions API.

Pi has no base-URL variable: the preset writes ``~/.pi/agent/models.json`` declaring a ``polar``
provider (``api: openai-completions``) with the served model, and sets ``PI_OFFLINE=1`` so startup
makes no network calls. Sends streaming ``POST {base}/v1/chat/completions`` with ``max_completion_tokens``.
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

PROVIDER = "polar"


class PiPreset(HarnessPreset):
    name = "pi"
    package = "@mariozechner/pi-coding-agent"
    version = "0.73.1"
    binary = "pi"
    api = "openai_chat"
    option_names = ("context_window", "thinking")

    def args(self, ctx: PresetContext) -> list[str]:
        return [
            "--print",
            "--mode", "json",
            "--offline",
            "--provider", PROVIDER,
            "--model", ctx.model,
            "--thinking", str(ctx.options.get("thinking", "off")),
            "--session-dir", str(ctx.home / ".pi" / "sessions"),
            "--no-extensions",
            *(
                ["--system-prompt", self.system_prompt(ctx), "--tools", "bash", "--no-skills", "--no-context-files", "--no-prompt-templates"]
                if self.compact(ctx)
                else (["--system-prompt", str(ctx.options["system_prompt"])] if ctx.options.get("system_prompt") else [])
            ),
        ]

    def env(self, ctx: PresetContext) -> dict[str, str]:
        return {"PI_OFFLINE": "1", "PI_CODING_AGENT_DIR": str(ctx.home / ".pi" / "agent")}

    def write_config(self, ctx: PresetContext, written: list[Path]) -> None:
        model = {
            "id": ctx.model,
            "name": ctx.model,
            "reasoning": False,
            "input": ["text"],
            "contextWindow": int(ctx.options.get("context_window", 32768)),
            "maxTokens": self.max_output_tokens(ctx) or 4096,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        }
        write_file(
            ctx.home / ".pi" / "agent" / "models.json",
            {
                "providers": {
                    PROVIDER: {
                        "baseUrl": ctx.base_url + "/v1",
                        "api": "openai-completions",
                        "apiKey": ctx.api_key,
                        "models": [model],
                    }
                }
            },
            written,
        )

    def transcript_globs(self) -> tuple[str, ...]:
        return (".pi/sessions/**/*.jsonl",)

    def collect(self, ctx: PresetContext, stdout: bytes, stderr: bytes) -> PresetOutput:
        events = parse_jsonl(stdout)
        final = ""
        for ev in events:
            msg = ev.get("message") if isinstance(ev.get("message"), dict) else None
            if ev.get("type") == "message_end" and msg and msg.get("role") == "assistant":
                parts = msg.get("content") or []
                text = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text")
                final = text or final
        return PresetOutput(
            final_text=final,
            transcript=events,
            transcript_files=self.find_transcripts(ctx),
            last_lines=last_lines(stderr + b"\n" + stdout),
        )
