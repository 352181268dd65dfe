"""``replicas: 2`` against two real vLLM CPU servers that polar launches (issue 35, item 3).

A gateway configured with ``model: smollm2-135m, engine: vllm, replicas: 2`` starts two servers. Which server
answered a call is read from each server's own Prometheus counter (``vllm:request_success_total`` on its
``/metrics``), not from polar's bookkeeping, so the checks below would catch a router that only believes it is
sticky. Slow: two vLLM starts on 2 cores take a minute or more.

- sessions stick: every call of a session reaches one server, and both servers get sessions;
- a weight sync reaches both servers (each one's ``/weight_info`` and its greedy answer);
- a SIGKILLed server's sessions are served by the survivor while it restarts, with the synced weights;
  the restarted server gets the current weights back before it takes calls again, and closing the gateway
  leaves no vLLM process.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from polar.inference import GenerationRequest, collect
from tests.inference.test_vllm import _base_state, _perturbed_state, run
from tests.vllm_util import live_group_members, wait_group_gone

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SESSIONS = [f"sticky-{i}" for i in range(8)]


def served_count(url: str) -> float:
    """Requests this vLLM server finished, from its own /metrics (summed over finish reasons)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text,
                                                      re.MULTILINE))


def counts(urls: list[str]) -> dict[str, float]:
    return {url: served_count(url) for url in urls}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from polar.config.gateway import GatewayConfig
    from polar.gateway import GatewayServer

    logs = tmp_path_factory.mktemp("vllm2-logs")
    config = GatewayConfig(model="smollm2-135m", engine="vllm", replicas=2, engine_log_dir=str(logs),
                           engine_kwargs={"enforce_eager": True, "max_model_len": 2048})
    gw = GatewayServer(config, records_dir=None).start()
    groups: list[int] = []
    try:
        groups = [r.proc.pid for r in gw.engine.fleet.replicas if r.proc is not None]
        yield gw
    finally:
        groups += [r.proc.pid for r in gw.engine.fleet.replicas if r.proc is not None]
        gw.stop()
        assert not any(live_group_members(g) for g in set(groups)), "vLLM processes outlived the gateway"


def ask(gw, session: str, text: str = "Name a colour.") -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{gw.url}/s/{session}/v1", api_key="x", max_retries=0, timeout=300)
    reply = client.chat.completions.create(model=gw.engine.model_name, max_tokens=6, temperature=0,
                                           messages=[{"role": "user", "content": text}])
    return reply.choices[0].message.content or ""


def test_two_launched_replicas_serve_and_each_session_sticks_to_one(gateway):
    urls = gateway.engine.fleet.urls
    assert len(urls) == 2 and len(set(urls)) == 2
    health = run(gateway.engine.health())
    assert [r["state"] for r in health["launched"]] == ["ok", "ok"], health
    served_by: dict[str, str] = {}
    for session in SESSIONS:
        for turn in range(3):
            before = counts(urls)
            ask(gateway, session, f"Name colour number {turn}.")
            after = counts(urls)
            moved = [url for url in urls if after[url] > before[url]]
            assert len(moved) == 1 and after[moved[0]] == before[moved[0]] + 1, (session, before, after)
            # every call of the session reached the same server
            assert served_by.setdefault(session, moved[0]) == moved[0], (session, served_by[session], moved[0])
    assert set(served_by.values()) == set(urls), served_by  # both servers got sessions


def test_a_weight_sync_reaches_both_replicas(gateway, tmp_path):
    from polar.config.sync import WeightSyncConfig

    engine = gateway.engine
    urls = engine.fleet.urls
    engine.configure_sync(WeightSyncConfig(), tmp_path / "sync")
    prompt = engine.tokenizer.encode("The colour of the sky is", add_special_tokens=False)

    def greedy_from(url: str) -> list[int]:
        # straight to one server (vLLM's own completions route), not through polar's router
        body = {"model": engine.model_name, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                "return_token_ids": True}
        return httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]["token_ids"]

    base = _base_state(Path(engine.model_folder))
    version = engine.policy_version + 1
    base_answers = [greedy_from(u) for u in urls]
    run(engine.update_weights(_perturbed_state(base, seed=11, scale=0.02), version))
    for url in urls:
        assert httpx.get(f"{url}/weight_info", timeout=30).json() == {"weight_version": str(version)}
        assert engine.last_sync["checks"][url]["ok"], engine.last_sync
    synced_answers = [greedy_from(u) for u in urls]
    assert synced_answers[0] == synced_answers[1]  # both servers hold the same new weights
    assert synced_answers != base_answers, "the perturbed weights did not change the greedy answer"


def test_a_killed_replicas_sessions_are_served_by_the_survivor_and_it_comes_back_synced(gateway):
    engine = gateway.engine
    fleet = engine.fleet
    urls = fleet.urls
    version = engine.policy_version
    assert version >= 1, "runs after the sync test: the restarted replica must get the synced weights back"
    owner = {s: engine.route(s)[0].url for s in SESSIONS}
    victim = fleet.replicas[0]
    survivor = next(u for u in urls if u != victim.url)
    on_victim = [s for s in SESSIONS if owner[s] == victim.url]
    assert on_victim, owner
    old = victim.proc
    os.kill(old.pid, signal.SIGKILL)
    old.wait(30)
    before = served_count(survivor)
    t0 = time.monotonic()
    for session in on_victim:
        assert ask(gateway, session)  # answered, without waiting for the restart
    served_s = time.monotonic() - t0
    assert served_count(survivor) == before + len(on_victim)
    # the restart: bounded wait, then the current weights before any call
    deadline = time.monotonic() + fleet.config.start_timeout_s
    while time.monotonic() < deadline and not (victim.starts == 2 and victim.state == "ok"):
        time.sleep(1)
    assert victim.starts == 2 and victim.state == "ok" and victim.proc is not old
    assert httpx.get(f"{victim.url}/weight_info", timeout=30).json() == {"weight_version": str(version)}
    assert wait_group_gone(old.pid, 30) == []
    # the survivor's answers came while the victim was down (its restart alone takes longer than they did)
    assert "=== polar: start 2 of replica 0" in victim.log_path.read_text(errors="replace")
    result = run(collect(engine.generate(GenerationRequest(
        engine.tokenizer.encode("Hello", add_special_tokens=False), max_tokens=4, temperature=0.0,
        stream=False, session_id=on_victim[0]))))
    assert result.policy_version == version
    print(f"sessions of the killed replica served by the survivor in {served_s:.1f} s")
