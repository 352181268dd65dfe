"""What each preset sets and writes, checked without running a CLI (``bin`` points at /bin/true)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar.errors import HarnessError
from polar.gateway.sessions import session_key
from polar.harness.agent.presets import PRESETS, PresetContext, get_preset

SID = "ses-abc123"
KEY = session_key(SID)  # the API key names the session (a CLI that drops the URL prefix still routes)


def launch(name: str, tmp_path: Path, **options):
    ctx = PresetContext(SID, "http://127.0.0.1:8100", "served-model", "Fix the bug.", tmp_path / "ws",
                        tmp_path / "home", {"bin": "/bin/true", **options})
    return ctx, get_preset(name).launch(ctx)


@pytest.mark.parametrize("name", list(PRESETS))
def test_environment_is_built_from_scratch(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-host-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real")
    ctx, spec = launch(name, tmp_path)
    assert "sk-real-host-key" not in spec.env.values() and "sk-ant-real" not in spec.env.values()
    assert spec.env["HOME"] == str(ctx.home) and spec.cwd == ctx.workspace
    assert spec.argv[-1] == "Fix the bug." and spec.stdin is None
    assert all(p.is_file() and ctx.home in p.parents for p in spec.written)


def test_claude_code_pins_every_model_alias(tmp_path: Path) -> None:
    _, spec = launch("claude_code", tmp_path, max_output_tokens=99)
    env = spec.env
    assert env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:8100/s/{SID}" and env["ANTHROPIC_API_KEY"] == KEY
    for var in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"):
        assert env[var] == "served-model", var
    assert spec.argv[spec.argv.index("--fallback-model") + 1] == "served-model"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "99"
    assert {"-p", "--dangerously-skip-permissions", "stream-json"} <= set(spec.argv)
    state = json.loads((Path(env["CLAUDE_CONFIG_DIR"]) / ".claude.json").read_text())
    assert state["hasCompletedOnboarding"] is True


def test_codex_writes_a_responses_provider(tmp_path: Path) -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    _, spec = launch("codex", tmp_path, compact=True)
    cfg = tomllib.loads((Path(spec.env["CODEX_HOME"]) / "config.toml").read_text())
    provider = cfg["model_providers"][cfg["model_provider"]]
    assert provider["wire_api"] == "responses"
    assert provider["base_url"] == f"http://127.0.0.1:8100/s/{SID}/v1"
    assert spec.env[provider["env_key"]] == KEY
    assert cfg["model"] == "served-model" and cfg["analytics"]["enabled"] is False
    assert Path(cfg["model_instructions_file"]).read_text().startswith("You are a coding agent")
    assert cfg["features"]["multi_agent"] is False and cfg["web_search"] == "disabled"
    assert spec.argv[1] == "exec" and "--dangerously-bypass-approvals-and-sandbox" in spec.argv


def test_qwen_code_uses_openai_variables(tmp_path: Path) -> None:
    ctx, spec = launch("qwen_code", tmp_path, compact=True, max_output_tokens=64)
    assert spec.env["OPENAI_BASE_URL"] == f"http://127.0.0.1:8100/s/{SID}/v1"
    assert spec.env["OPENAI_API_KEY"] == KEY and spec.env["OPENAI_MODEL"] == "served-model"
    assert "--model" not in spec.argv  # the model goes through OPENAI_MODEL only
    assert spec.env["QWEN_CODE_MAX_OUTPUT_TOKENS"] == "64"
    assert spec.argv[spec.argv.index("--core-tools") + 1] == "run_shell_command"
    settings = json.loads((ctx.home / ".qwen" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "openai" and settings["telemetry"]["enabled"] is False


def test_gemini_cli_selects_api_key_auth_and_trust(tmp_path: Path) -> None:
    ctx, spec = launch("gemini_cli", tmp_path, compact=True)
    assert spec.env["GOOGLE_GEMINI_BASE_URL"] == f"http://127.0.0.1:8100/s/{SID}" and spec.env["GEMINI_API_KEY"] == KEY
    assert spec.env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    settings = json.loads((ctx.home / ".gemini" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key" == settings["selectedAuthType"]
    assert settings["tools"]["core"] == ["run_shell_command"]
    assert Path(spec.env["GEMINI_SYSTEM_MD"]).read_text().startswith("You are a coding agent")


def test_pi_writes_a_models_file(tmp_path: Path) -> None:
    ctx, spec = launch("pi", tmp_path, max_output_tokens=128)
    models = json.loads((ctx.home / ".pi" / "agent" / "models.json").read_text())
    provider = models["providers"][spec.argv[spec.argv.index("--provider") + 1]]
    assert provider["baseUrl"] == f"http://127.0.0.1:8100/s/{SID}/v1" and provider["api"] == "openai-completions"
    assert provider["apiKey"] == KEY and provider["models"][0]["id"] == "served-model"
    assert provider["models"][0]["maxTokens"] == 128
    assert spec.env["PI_OFFLINE"] == "1" and "--print" in spec.argv


def test_unknown_option_is_named_with_a_suggestion(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="did you mean: max_turns"):
        launch("claude_code", tmp_path, max_turn=3)


def test_bad_bin_names_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="make harnesses"):
        get_preset("pi").resolve_binary({"bin": str(tmp_path / "nope")})


def test_collect_reads_final_answers(tmp_path: Path) -> None:
    ctx = PresetContext(SID, "http://x:1", "m", "t", tmp_path / "ws", tmp_path / "home")
    claude = b'{"type":"system"}\n{"type":"result","result":"all fixed"}\n'
    assert get_preset("claude_code").collect(ctx, claude, b"").final_text == "all fixed"
    codex = b'{"type":"item.completed","item":{"type":"agent_message","text":"patched"}}\n'
    assert get_preset("codex").collect(ctx, codex, b"").final_text == "patched"
    gemini = b'Loaded cached credentials.\n{"response": "done", "stats": {}}'
    assert get_preset("gemini_cli").collect(ctx, gemini, b"").final_text == "done"
    pi = b'{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"ok"}]}}\n'
    out = get_preset("pi").collect(ctx, pi, b"warning: slow\n")
    assert out.final_text == "ok" and out.last_lines[0] == "warning: slow"
