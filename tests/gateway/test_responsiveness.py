"""One huge request never stalls the gateway: its prompt is tokenized off the event loop, a prompt that
cannot fit is refused before its ids exist, and its record keeps a token count and a hash, not the ids.

The latency bound (the event loop never blocks for more than 50 ms on one request) is what the issue
asks for. ``/health`` is polled from another process: a poller in the gateway's own process waits for
the GIL too, so a stall that begins between two of its polls is never timed. On a loaded machine a thread can wait that long for a CPU whatever the gateway does, so the
test first measures the same polls while the gateway receives and parses the same 8 MiB body (for a
model it does not serve: a 404, no processing) and a plain thread tokenizes part of the text; the bound
is 50 ms or three times that control's slowest poll, whichever is larger, and a measurement that a
one-off hiccup spoiled is repeated (at most 3 times). A loop that tokenizes the prompt itself is
blocked for seconds, every time."""

from __future__ import annotations

import hashlib
import http.client
import json
import subprocess
import sys
import threading

import httpx

from polar.inference.base import Engine, GenerationRequest, TokenEvent

PROMPT_BYTES = 8 * 1024 * 1024
LATENCY_BOUND_S = 0.050


class NeverCalled(Engine):
    """An engine with a long context (2M tokens) over the tiny tokenizer; its prompts must never arrive."""

    def __init__(self, tokenizer, context_length: int = 2**21) -> None:
        self.tokenizer, self.model_name, self.context_length = tokenizer, "tiny", context_length
        self.default_stop_token_ids = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest):
        self.requests.append(request)
        yield TokenEvent(self.default_stop_token_ids[0], -0.5, "stop", 0)


def _big_text() -> str:
    # "hello world fix " is 6 tiny tokens: 3.1M tokens, more than the 2M context, but the text is short
    # enough (per the longest vocabulary piece) that only tokenizing it all can tell
    return "hello world fix " * (PROMPT_BYTES // 16)


def _big_body() -> bytes:
    return json.dumps({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": _big_text()}]}).encode()


POLLER = r"""
import http.client, json, select, sys, time
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
polls = []
for i in range(1_000_000):  # bounded by the test, which writes a line once its calls are done
    t0 = time.perf_counter()
    conn.request("GET", "/health")
    health = json.loads(conn.getresponse().read())
    polls.append([time.perf_counter() - t0, health["inflight"]])
    if i == 0:
        print("ready", flush=True)
    if select.select([sys.stdin], [], [], 0.003)[0]:
        break
json.dump(polls, sys.stdout)
"""


def _poll_while(port: int, *threads: threading.Thread) -> tuple[list[float], int]:
    """Poll ``/health`` every few ms from another process while ``threads`` run (started here); the
    latencies, and how many polls saw a call in flight. Another process, because a poller sharing the
    gateway's GIL stops too while the GIL is held, and a stall between two of its polls goes unseen."""
    poller = subprocess.Popen([sys.executable, "-c", POLLER, str(port)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert poller.stdout.readline().strip() == "ready"
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        out, _ = poller.communicate("stop\n", timeout=60)
    finally:
        poller.kill()
        poller.wait(10)
    polls = json.loads(out)
    return [latency_s for latency_s, _ in polls], sum(inflight >= 1 for _, inflight in polls)


def _post_in_background(port: int, path: str, body: bytes) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def post() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", path, body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        result["status"], result["body"] = resp.status, json.loads(resp.read())

    return threading.Thread(target=post, daemon=True), result


def test_health_answers_within_50ms_while_an_8mib_prompt_is_tokenized(gateway, tiny_tokenizer):
    engine = NeverCalled(tiny_tokenizer)
    gw = gateway(engine, max_body_bytes=32 * 1024 * 1024)
    body, text = _big_body(), _big_text()
    backend = tiny_tokenizer.backend_tokenizer
    # A loop that tokenizes the prompt itself is blocked for seconds, every time; a loaded machine's
    # scheduling hiccup does not repeat. So up to 3 attempts, each with its own control measurement.
    attempts = []
    for attempt in range(3):
        # control: the same body sent for a model not served here (received and parsed on the loop, then
        # a 404) while a plain thread tokenizes part of the text, i.e. everything but the call's processing
        not_served = body.replace(b'"model": "tiny"', b'"model": "not-served"', 1)
        encoder = threading.Thread(target=lambda: backend.encode_batch_fast([text[: len(text) // 4]]), daemon=True)
        control, control_result = _post_in_background(gw.port, "/v1/chat/completions", not_served)
        control_latencies, _ = _poll_while(gw.port, control, encoder)
        assert control_result["status"] == 404, control_result
        bound_s = max(LATENCY_BOUND_S, 3 * max(control_latencies))

        thread, result = _post_in_background(gw.port, f"/s/huge-{attempt}/v1/chat/completions", body)
        latencies, polls_in_flight = _poll_while(gw.port, thread)  # in flight: the call entered and is not done
        assert result["status"] == 400, result
        assert polls_in_flight >= 3, "no /health call was answered while the big prompt was being processed"
        attempts.append((max(latencies), bound_s, len(latencies)))
        if max(latencies) < bound_s:
            break
    assert attempts[-1][0] < attempts[-1][1], f"slowest /health call (s), bound (s), polls: {attempts}"
    err = result["body"]["error"]
    assert err["code"] == "context_length_exceeded" and "at least" in err["message"]
    assert engine.requests == []

    # the refused call is recorded by its token count and a hash of its rendering, never by 3M ids
    (rec,) = gw.records(f"huge-{attempt}")
    assert not rec.complete and rec.prompt_ids == [] and rec.sampled_ids == []
    rejected = rec.metadata["rejected_prompt"]
    assert rejected["tokens"] > engine.context_length and rejected["tokens_at_least"] is True
    assert len(rejected["sha256"]) == 64
    r = httpx.get(f"{gw.url}/sessions/huge-{attempt}", timeout=60)
    assert r.status_code == 200 and len(r.content) < PROMPT_BYTES + 100_000  # the message text, no ids


def test_a_prompt_too_long_to_fit_is_refused_from_its_length_alone(gateway, tiny_tokenizer, monkeypatch):
    """With the tiny model's 4096-token context an 8 MiB prompt is refused before it is tokenized."""
    engine = NeverCalled(tiny_tokenizer, context_length=4096)
    gw = gateway(engine, max_body_bytes=32 * 1024 * 1024)
    encoded: list[int] = []
    builder = gw.app.core.prompts
    encode = builder.encode
    monkeypatch.setattr(builder, "encode", lambda text, *a: encoded.append(len(text)) or encode(text, *a))

    r = httpx.post(f"{gw.url}/s/long/v1/chat/completions", content=_big_body(),
                   headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "at least" in err["message"]
    assert max(encoded, default=0) < 1000  # nothing big was tokenized
    (rec,) = gw.records("long")
    assert rec.prompt_ids == [] and rec.metadata["rejected_prompt"]["tokens"] > 4096

    # an ordinary call on the same gateway still works, and a prompt that fits is not refused
    r = httpx.post(f"{gw.url}/s/long/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi " * 1000}]})
    assert r.status_code == 200 and len(engine.requests) == 1


def test_prompt_hash_names_the_rendering(tiny_tokenizer):
    from polar.gateway.prompt import PromptBuilder, PromptTooLong

    pb = PromptBuilder(tiny_tokenizer, [tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")])
    msgs = [{"role": "user", "content": "x " * 5000}]
    full = pb.render(msgs, [], generation=True)
    exact = len(pb.build(msgs, [], lambda k: None).ids)
    try:
        pb.build(msgs, [], lambda k: None, context_length=exact)  # one short of room to generate
    except PromptTooLong as e:
        assert e.prompt_sha256 == hashlib.sha256(full.encode()).hexdigest()
        assert e.prompt_tokens <= exact
    else:
        raise AssertionError("a prompt that fills the whole context was accepted")
    assert len(pb.build(msgs, [], lambda k: None, context_length=exact + 1).ids) == exact
