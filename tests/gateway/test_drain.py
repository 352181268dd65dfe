"""Weight-sync drain: pause (wait or 429 + Retry-After), in-flight calls finish, swap, resume, and the new
policy version is stamped on later records. Admin endpoints and session reads honour the admin token."""

from __future__ import annotations

import copy
import threading
import time

import httpx
import pytest
import torch

from polar.gateway.sessions import key_session_id
from polar.inference.embedded import sequence_logprobs

REPLY = "a reply long enough to still be streaming while the weights are swapped"


@pytest.fixture
def own_model():
    """A tiny model of our own: these tests change weights, which must not leak into other tests."""
    from polar.inference.tiny import build_tiny

    return build_tiny(1)


def _perturbed(model) -> dict[str, torch.Tensor]:
    return {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items() if k == "lm_head.weight"}


def test_update_weights_drains_in_flight_calls_and_stamps_the_new_version(gateway, own_model):
    from openai import OpenAI

    from polar.inference.scripted import ScriptedEngine

    model, tok = own_model
    old_model = copy.deepcopy(model)
    engine = ScriptedEngine(tok, lambda req, i: REPLY, model=model, model_name="tiny", token_delay_s=0.02)
    gw = gateway(engine)
    client = OpenAI(base_url=f"{gw.url}/s/drain/v1", api_key="x", max_retries=0)
    first_chunk = threading.Event()
    result: dict = {}

    def in_flight() -> None:
        text = []
        for chunk in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go"}], stream=True):
            first_chunk.set()
            text.append(chunk.choices[0].delta.content or "")
            if chunk.choices[0].finish_reason:
                result["finish"] = chunk.choices[0].finish_reason
        result["text"] = "".join(text)

    t = threading.Thread(target=in_flight)
    t.start()
    assert first_chunk.wait(60)
    status = gw.update_weights(_perturbed(model), version=1, timeout_s=60)
    t.join(60)
    assert status == {"paused": False, "inflight": 0, "waiting": 0, "drained": False, "policy_version": 1}
    assert result == {"finish": "stop", "text": REPLY}  # the in-flight call finished, it was not aborted
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "after"}])
    before, after = gw.records("drain")
    assert (before.policy_version, after.policy_version) == (0, 1)
    for rec, weights in ((before, old_model), (after, model)):
        recomputed = sequence_logprobs(weights, rec.prompt_ids + rec.sampled_ids)[len(rec.prompt_ids) - 1 :]
        assert max(abs(a - b) for a, b in zip(recomputed, rec.logprobs, strict=True)) < 1e-4


def test_paused_calls_wait_for_resume(gateway, scripted):
    from openai import OpenAI

    gw = gateway(scripted(lambda req, i: "ok"), pause_mode="wait", pause_wait_s=60)
    assert gw.pause(timeout_s=5) == {"paused": True, "inflight": 0, "waiting": 0, "drained": True}
    out: dict = {}
    client = OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
    t = threading.Thread(target=lambda: out.setdefault("r", client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}])))
    t.start()
    deadline = time.monotonic() + 60
    while httpx.get(f"{gw.url}/health", timeout=60).json()["waiting"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    health = httpx.get(f"{gw.url}/health", timeout=60).json()
    assert (health["waiting"], health["inflight"]) == (1, 0), health  # held at the gate, not generating
    assert t.is_alive() and not gw.records("x")
    gw.resume()
    t.join(60)
    assert out["r"].choices[0].message.content == "ok"


def test_admin_endpoints_need_the_token_and_reject_mode_sends_429(gateway, own_model, tmp_path):
    import openai
    from safetensors.torch import save_file

    from polar.inference.scripted import ScriptedEngine

    model, tok = own_model
    engine = ScriptedEngine(tok, lambda req, i: "ok", model=model, model_name="tiny")
    gw = gateway(engine, admin_token="s3cret", pause_mode="reject", retry_after_s=2)
    admin = {"x-polar-admin-token": "s3cret"}
    assert httpx.post(f"{gw.url}/admin/pause", timeout=60).status_code == 401
    assert httpx.post(f"{gw.url}/admin/pause", headers={"x-polar-admin-token": "wrong"}, timeout=60).status_code == 401
    assert httpx.post(f"{gw.url}/admin/pause", headers=admin, timeout=60).json()["drained"] is True
    r = httpx.post(f"{gw.url}/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}, timeout=60)
    assert r.status_code == 429 and r.headers["retry-after"] == "2" and r.json()["error"]["type"] == "rate_limit_error"
    with pytest.raises(openai.RateLimitError):
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}])
    assert httpx.post(f"{gw.url}/admin/resume", headers=admin, timeout=60).json()["paused"] is False

    path = tmp_path / "w.safetensors"
    save_file(_perturbed(model), str(path))
    r = httpx.post(f"{gw.url}/admin/weights", json={"path": str(path), "policy_version": 7}, headers=admin, timeout=60)
    assert r.status_code == 200 and r.json()["policy_version"] == 7
    bad = httpx.post(f"{gw.url}/admin/weights", json={"path": str(tmp_path / "none.safetensors"), "policy_version": 8}, headers=admin, timeout=60)
    assert bad.status_code == 400 and "cannot read weights" in bad.json()["error"]["message"]

    oa = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-test-A", max_retries=0)
    oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "mine"}])
    assert gw.records("sk-test-A")[0].policy_version == 7
    # only the session itself (or the admin) may read its records
    assert httpx.get(f"{gw.url}/sessions/sk-test-A", headers={"authorization": "Bearer sk-test-B"}, timeout=60).status_code == 403
    assert httpx.get(f"{gw.url}/sessions/sk-test-A/trajectory", headers={"authorization": "Bearer sk-test-B"}, timeout=60).status_code == 403
    own = httpx.get(f"{gw.url}/sessions/sk-test-A", headers={"authorization": "Bearer sk-test-A"}, timeout=60).json()
    assert [r["messages"][-1]["content"] for r in own["records"]] == ["mine"]
    assert httpx.get(f"{gw.url}/sessions/sk-test-A", headers=admin, timeout=60).status_code == 200
    assert httpx.get(f"{gw.url}/sessions", timeout=60).status_code == 401
    # the session the key named is listed by its hashed id, never by the key
    assert httpx.get(f"{gw.url}/sessions", headers=admin, timeout=60).json() == {"sessions": [key_session_id("sk-test-A")]}
    # an API key is never written as a file name
    assert [p.name for p in gw.app.store.dir.glob("*.jsonl")] == [f"{key_session_id('sk-test-A')}.jsonl"]
