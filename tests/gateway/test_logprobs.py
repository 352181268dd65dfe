"""Logprobs in OpenAI's shape, read with the official openai SDK: each token's decoded text and UTF-8
bytes (not the tokenizer's piece spelling), and real top-k alternatives when asked, or a 400 when the
engine cannot give them."""

from __future__ import annotations

import math

import pytest

from polar.inference.sampling import sequence_top_logprobs


def test_tokens_are_text_and_bytes_with_real_alternatives(gateway, embedded, tiny):
    from openai import OpenAI

    model, tok = tiny
    gw = gateway(embedded)
    client = OpenAI(base_url=f"{gw.url}/s/lp/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "fix it"}],
                                       max_tokens=8, logprobs=True, top_logprobs=3, seed=3)
    (rec,) = gw.records("lp")
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(rec.logprobs)
    # the bytes of all tokens are the UTF-8 of the decoded output; each token's text is its own bytes
    joined = b"".join(bytes(c.bytes) for c in content)
    assert joined == tok.decode(rec.sampled_ids, skip_special_tokens=False).encode()
    for c in content:
        assert c.token == bytes(c.bytes).decode("utf-8", errors="replace")
        assert "\u0120" not in c.token  # never byte-level BPE's spelling of a space
    # the alternatives are the model's 3 most likely next tokens at each step, most likely first
    ref = sequence_top_logprobs(model, rec.prompt_ids + rec.sampled_ids, len(rec.prompt_ids), 3)
    for c, want, sampled_lp in zip(content, ref, rec.logprobs, strict=True):
        assert len(c.top_logprobs) == 3
        assert [a.logprob for a in c.top_logprobs] == pytest.approx([lp for _, lp in want], abs=1e-4)
        assert [a.token for a in c.top_logprobs] == [tok.decode([i]) for i, _ in want]
        assert c.top_logprobs[0].logprob >= sampled_lp - 1e-4 and all(a.logprob <= 0 for a in c.top_logprobs)
        assert math.fsum(math.exp(a.logprob) for a in c.top_logprobs) <= 1 + 1e-4


def test_a_space_token_reads_as_a_space(gateway, scripted):
    from openai import OpenAI

    gw = gateway(scripted(["fix naïve 日本"]))
    r = OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}], logprobs=True)
    content = r.choices[0].logprobs.content
    assert b"".join(bytes(c.bytes) for c in content).decode().startswith("fix naïve 日本")
    # the tiny tokenizer's pieces are f, ix, Ġn, a, Ã, ¯, ve, Ġ, ...: a space reads as a space, and
    # each half of "ï" is one byte of it (its text is U+FFFD, its bytes say exactly which byte)
    assert [c.token for c in content[:4]] == ["f", "ix", " n", "a"]
    assert [c.bytes for c in content[4:6]] == [[0xC3], [0xAF]] and content[4].token == "\ufffd"
    assert content[7].token == " "
    assert all(c.top_logprobs == [] for c in content)  # none asked for


def test_top_logprobs_the_engine_cannot_give_is_a_400(gateway, tiny_tokenizer):
    import openai
    from openai import OpenAI

    from polar.inference.scripted import ScriptedEngine

    gw = gateway(ScriptedEngine(tiny_tokenizer, ["hello"], model_name="tiny"))  # no model: no logits
    client = OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "go"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=msgs, logprobs=True, top_logprobs=2)
    assert e.value.body["param"] == "top_logprobs" and "cannot report alternatives" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=msgs, logprobs=True, top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=msgs, top_logprobs=2)
    assert "needs 'logprobs': true" in e.value.body["message"]
    # logprobs without alternatives still work on this engine
    r = client.chat.completions.create(model="tiny", messages=msgs, logprobs=True)
    assert r.choices[0].logprobs.content[0].bytes is not None
