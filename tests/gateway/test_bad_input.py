"""Bad input gets the provider's own error shape, the right status and a message naming the problem;
engine failures are provider-shaped 5xx; nothing takes the server down."""

from __future__ import annotations

import httpx
import pytest

from polar.inference.base import EngineError

PATHS = {
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
    "anthropic": "/v1/messages",
    "gemini": "/v1beta/models/tiny:generateContent",
}


def good(provider: str, text: str = "hi") -> dict:
    return {
        "openai_chat": {"model": "tiny", "messages": [{"role": "user", "content": text}]},
        "openai_responses": {"model": "tiny", "input": text},
        "anthropic": {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": text}]},
        "gemini": {"contents": [{"role": "user", "parts": [{"text": text}]}]},
    }[provider]


def error_message(provider: str, r: httpx.Response) -> str:
    """Check the provider's error envelope and return its message."""
    body = r.json()
    if provider == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        return body["error"]["message"]
    if provider == "gemini":
        assert body["error"]["code"] == r.status_code and isinstance(body["error"]["status"], str)
        return body["error"]["message"]
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    return body["error"]["message"]


def bad_cases(provider: str) -> list[tuple[str, object, int, str]]:
    """(name, body, status, text the message must contain)."""
    unknown_role = {
        "openai_chat": {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]},
        "openai_responses": {"model": "tiny", "input": [{"role": "wizard", "content": "x"}]},
        "anthropic": {"model": "tiny", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]},
        "gemini": {"contents": [{"role": "wizard", "parts": [{"text": "x"}]}]},
    }[provider]
    image = {
        "openai_chat": {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "openai_responses": {"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "anthropic": {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        "gemini": {"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": ""}}]}]},
    }[provider]
    missing = {"openai_chat": "messages", "openai_responses": "input", "anthropic": "messages", "gemini": "contents"}[provider]
    no_field = {k: v for k, v in good(provider).items() if k != missing}
    cases = [
        ("malformed json", b'{"model": "tiny", "messages": [', 400, "not valid JSON"),
        ("not an object", b"[1, 2]", 400, "JSON object"),
        ("missing field", no_field, 400, missing),
        ("unknown role", unknown_role, 400, "role"),
        ("unknown content type", image, 400, "not supported"),
        ("bad temperature", {**good(provider), "temperature": -1} if provider != "gemini"
         else {**good(provider), "generationConfig": {"temperature": -1}}, 400, "temperature"),
        ("oversized body", good(provider, "x" * 5000), 413, "max_body_bytes"),
    ]
    if provider == "anthropic":
        cases.append(("missing max_tokens", {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}, 400, "max_tokens"))
    if provider != "gemini":
        cases.append(("unknown model", {**good(provider), "model": "gpt-99"}, 404, "gpt-99"))
    return cases


@pytest.mark.parametrize("provider", list(PATHS))
def test_bad_requests_get_provider_errors_and_the_server_survives(provider, gateway, scripted):
    gw = gateway(scripted(lambda req, i: "ok"), max_body_bytes=4096)
    for name, body, status, needle in bad_cases(provider):
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = httpx.post(gw.url + PATHS[provider], headers={"content-type": "application/json"}, **kw, timeout=60)
        assert r.status_code == status, (name, r.text)
        assert needle in error_message(provider, r), (name, r.text)
    if provider == "gemini":
        r = httpx.post(f"{gw.url}/v1beta/models/gemini-99:generateContent", json=good(provider), timeout=60)
        assert r.status_code == 404 and "gemini-99" in error_message(provider, r)
    r = httpx.post(gw.url + PATHS[provider], json=good(provider), timeout=60)
    assert r.status_code == 200, r.text
    assert httpx.get(f"{gw.url}/health", timeout=60).json()["status"] == "ok"


def test_context_length_maps_to_each_sdks_error(gateway, scripted):
    import anthropic
    import openai
    from google import genai
    from google.genai import errors as genai_errors
    from google.genai import types

    gw = gateway(scripted(lambda req, i: "ok", context_length=64))
    long = "many words " * 200
    oa = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}])
    assert e.value.code == "context_length_exceeded" and "maximum context length is 64" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(model="tiny", input=long)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0).messages.create(
            model="tiny", max_tokens=8, messages=[{"role": "user", "content": long}])
    assert "prompt is too long" in str(e.value) and "> 64 maximum" in str(e.value)
    client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=gw.url, api_version="v1beta"))
    with pytest.raises(genai_errors.ClientError) as e:
        client.models.generate_content(model="tiny", contents=long)
    assert e.value.code == 400 and "exceeds the maximum number of tokens allowed (64)" in str(e.value)
    failed = gw.records("x")
    assert len(failed) == 4 and all(not r.complete and r.error for r in failed)  # failures are recorded too


def test_engine_failure_is_a_provider_shaped_5xx(gateway, scripted):
    def explode(req, i):
        raise EngineError("GPU fell off the bus")

    gw = gateway(scripted(explode))
    for provider, path in PATHS.items():
        r = httpx.post(gw.url + path, json=good(provider), timeout=60)
        assert r.status_code == 500, r.text
        assert "GPU fell off the bus" in error_message(provider, r)
    r = httpx.post(gw.url + PATHS["openai_chat"], json={**good("openai_chat"), "stream": True}, timeout=60)
    assert r.status_code == 500  # failures before the first token are still a proper status, not a 200 stream
    assert httpx.get(f"{gw.url}/health", timeout=60).status_code == 200


def test_unsupported_features_are_explicit(gateway, scripted):
    gw = gateway(scripted(lambda req, i: "ok"))
    r = httpx.post(gw.url + "/v1/responses", json={"model": "tiny", "input": "x", "previous_response_id": "resp_1"}, timeout=60)
    assert r.status_code == 400 and "previous_response_id" in r.json()["error"]["message"]
    r = httpx.post(gw.url + "/v1/chat/completions", json={**good("openai_chat"), "n": 2}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = httpx.post(gw.url + "/v1beta/models/tiny:streamGenerateContent", json=good("gemini"), timeout=60)
    assert r.status_code == 400 and "alt=sse" in r.json()["error"]["message"]
    r = httpx.post(gw.url + "/s/x/v1/completions", json={"model": "tiny", "prompt": "hi"}, timeout=60)
    assert r.status_code == 404 and "/v1/chat/completions" in r.json()["error"]["message"]
    assert httpx.get(gw.url + "/v1/chat/completions", timeout=60).status_code == 405
