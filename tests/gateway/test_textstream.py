"""Streaming text decisions: partial UTF-8, stop strings split across tokens, tool-call holdback."""

from __future__ import annotations

from polar.gateway.textstream import IncrementalDetokenizer, TextStream
from polar.gateway.toolcalls import parse_hermes


def _stream(tokenizer, text: str, stop=(), parse_tools=False) -> tuple[list[str], TextStream]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    ts = TextStream(stop, parse_tools)
    deltas = []
    for i in ids:
        d = ts.feed(detok.push(i))
        if d:
            deltas.append(d)
        if ts.stop_hit:
            break
    else:
        deltas.append(ts.feed(detok.flush()))
    deltas.append(ts.finish())
    return [d for d in deltas if d], ts


def test_multibyte_characters_never_split(tiny_tokenizer):
    text = "héllo wörld ☃ 日本語 🙂 done"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # byte-level BPE: some characters span several tokens
    detok = IncrementalDetokenizer(tiny_tokenizer)
    deltas = [detok.push(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text


def test_stop_string_across_tokens_is_cut_and_never_shown(tiny_tokenizer):
    deltas, ts = _stream(tiny_tokenizer, "alpha beta STOPHERE gamma", stop=["STOPHERE"])
    assert ts.stop_hit == "STOPHERE"
    assert "".join(deltas) == ts.text == "alpha beta "  # the text before the stop string, exactly
    assert not any("STOP" in d for d in deltas)


def test_earliest_stop_string_wins(tiny_tokenizer):
    _, ts = _stream(tiny_tokenizer, "one two three four", stop=["four", "two"])
    assert ts.stop_hit == "two" and ts.text == "one "


def test_tool_call_text_is_held_back(tiny_tokenizer):
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    deltas, ts = _stream(tiny_tokenizer, text, parse_tools=True)
    assert "".join(deltas) == "Let me add."
    parsed = parse_hermes(ts.text)
    assert parsed.content == "Let me add."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("add", {"a": 1})]


def test_without_tools_tool_markup_is_plain_text(tiny_tokenizer):
    text = 'x <tool_call>{"name": "f"}</tool_call>'
    deltas, _ = _stream(tiny_tokenizer, text, parse_tools=False)
    assert "".join(deltas) == text


def test_malformed_tool_call_stays_text_with_error():
    parsed = parse_hermes('<tool_call>\n{"name": "add", "arguments": {"a": </tool_call>')
    assert parsed.tool_calls == []
    assert parsed.content.startswith("<tool_call>")
    assert "not valid JSON" in parsed.parse_error


def test_several_tool_calls_and_string_arguments():
    parsed = parse_hermes('<tool_call>{"name": "a", "arguments": "{\\"x\\": 2}"}</tool_call>\n'
                          '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("a", {"x": 2}), ("b", {})]
    assert parsed.content == ""
