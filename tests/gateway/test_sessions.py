"""Sessions under load, durable records, and trajectories served over HTTP (both builders)."""

from __future__ import annotations

import asyncio
import json

import httpx

from polar.inference.embedded import sequence_logprobs

N_SESSIONS, N_TURNS = 64, 5


def _turn_body(provider: str, sid: str, history: list[tuple[str, str]], turn: int) -> tuple[str, dict]:
    """A request for ``provider`` whose every user message names its session (to catch mix-ups)."""
    user = f"session {sid} turn {turn}"
    if provider == "anthropic":
        msgs = []
        for u, a in history:
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": [{"type": "text", "text": a}]}]
        msgs.append({"role": "user", "content": user})
        return "/v1/messages", {"model": "tiny", "max_tokens": 4, "system": f"sys {sid}", "messages": msgs}
    msgs = [{"role": "system", "content": f"sys {sid}"}]
    for u, a in history:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    msgs.append({"role": "user", "content": user})
    return "/v1/chat/completions", {"model": "tiny", "max_tokens": 4, "messages": msgs}


def _reply(provider: str, body: dict) -> str:
    if provider == "anthropic":
        return "".join(b.get("text", "") for b in body["content"])
    return body["choices"][0]["message"]["content"] or ""


async def _session(client: httpx.AsyncClient, url: str, i: int) -> list[str]:
    sid = f"conc-{i:02d}"
    provider = "anthropic" if i % 2 else "openai_chat"
    history: list[tuple[str, str]] = []
    for turn in range(N_TURNS):
        path, body = _turn_body(provider, sid, history, turn)
        headers = {"x-polar-session": sid} if i % 3 == 0 else {}
        target = f"{url}{path}" if headers else f"{url}/s/{sid}{path}"
        r = await client.post(target, json=body, headers=headers)
        assert r.status_code == 200, r.text
        history.append((f"session {sid} turn {turn}", _reply(provider, r.json())))
    return [a for _, a in history]


def test_64_concurrent_sessions_5_turns_no_record_lost_or_misattributed(gateway, embedded):
    gw = gateway(embedded)

    async def run() -> list[list[str]]:
        limits = httpx.Limits(max_connections=N_SESSIONS, max_keepalive_connections=N_SESSIONS)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            return await asyncio.gather(*(_session(client, gw.url, i) for i in range(N_SESSIONS)))

    replies = asyncio.run(run())
    files = sorted(p.name for p in gw.app.store.dir.glob("*.jsonl"))
    assert files == [f"conc-{i:02d}.jsonl" for i in range(N_SESSIONS)]
    for i in range(N_SESSIONS):
        sid = f"conc-{i:02d}"
        lines = (gw.app.store.dir / f"{sid}.jsonl").read_text().splitlines()
        recs = [json.loads(x) for x in lines]
        assert [r["call_index"] for r in recs] != [] and sorted(r["call_index"] for r in recs) == list(range(N_TURNS))
        for r in sorted(recs, key=lambda r: r["call_index"]):
            assert r["session_id"] == sid and r["complete"]
            texts = " ".join(m["content"] for m in r["messages"] if m["role"] in ("user", "system"))
            assert texts.count(sid) == r["call_index"] + 2  # system + every user turn, all this session's
            assert "conc-" not in texts.replace(sid, "")  # no other session's text leaked in
            assert r["metadata"]["output"]["content"] == replies[i][r["call_index"]]
            if r["call_index"]:
                prev = next(p for p in recs if p["call_index"] == r["call_index"] - 1)
                assert r["metadata"]["prompt_reuse"].get("call_index") == r["call_index"] - 1, (
                    r["metadata"]["prompt_reuse"], prev["metadata"]["output"], r["messages"][-2:])


def test_trajectories_over_http_with_a_prefix_break(gateway, embedded, tiny):
    """Three turns chain; a fourth with rewritten history breaks the prefix and starts a new chain."""
    from openai import OpenAI

    model, _ = tiny
    gw = gateway(embedded)
    client = OpenAI(base_url=f"{gw.url}/s/traj/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "first question"}]
    for turn in range(3):
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": f"next {turn}"}]
    compacted = [{"role": "user", "content": "summary of the earlier conversation"}, *msgs[-3:]]
    client.chat.completions.create(model="tiny", messages=compacted, max_tokens=6)

    recs = gw.records("traj")
    per = httpx.get(f"{gw.url}/sessions/traj/trajectory", params={"builder": "per_request"}, timeout=60).json()
    merged = httpx.get(f"{gw.url}/sessions/traj/trajectory", params={"builder": "prefix_merging"}, timeout=60).json()
    assert len(per["samples"]) == 4
    assert len(merged["samples"]) == 2 and merged["stats"]["prefix_breaks"] == 1
    chain = merged["samples"][0]
    def calls_of(sample: dict) -> list[int]:  # call_indices is per token; -1/0 outside sampled spans
        return sorted({c for c, m in zip(sample["call_indices"], sample["loss_mask"], strict=True) if m})

    assert calls_of(chain) == [0, 1, 2] and calls_of(merged["samples"][1]) == [3]
    # the merged sequence is the last chained call's prompt plus its sampled ids, and only sampled ids train
    assert chain["token_ids"] == recs[2].prompt_ids + recs[2].sampled_ids
    assert sum(chain["loss_mask"]) == sum(len(r.sampled_ids) for r in recs[:3])
    for builder in (per, merged):
        for s in builder["samples"]:
            recomputed = sequence_logprobs(model, s["token_ids"])
            for pos, (m, lp) in enumerate(zip(s["loss_mask"], s["logprobs"], strict=True)):
                if m:
                    assert abs(recomputed[pos - 1] - lp) < 1e-4
    assert httpx.get(f"{gw.url}/sessions/traj/trajectory", params={"builder": "nope"}, timeout=60).status_code == 400
    assert httpx.get(f"{gw.url}/sessions/nobody", timeout=60).status_code == 404


def test_records_survive_a_restart_and_reuse_continues(gateway, tiny, tmp_path):
    """A second gateway on the same records directory continues call indices and exact-id reuse."""
    from openai import OpenAI

    from polar.config.gateway import GatewayConfig
    from polar.gateway.server import GatewayServer
    from polar.inference.embedded import EmbeddedEngine

    model, tok = tiny
    records = tmp_path / "durable"
    msgs = [{"role": "user", "content": "hello"}]
    with GatewayServer(GatewayConfig(), EmbeddedEngine(model, tok, model_name="tiny"), records) as gw:
        r = OpenAI(base_url=f"{gw.url}/s/dur/v1", api_key="x").chat.completions.create(model="tiny", messages=msgs, max_tokens=5)
        first = gw.records("dur")[0]
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "again"}]
    with GatewayServer(GatewayConfig(resume_records=True), EmbeddedEngine(model, tok, model_name="tiny"), records) as gw:
        OpenAI(base_url=f"{gw.url}/s/dur/v1", api_key="x").chat.completions.create(model="tiny", messages=msgs, max_tokens=5)
        a, b = gw.records("dur")
    assert a.to_dict() == first.to_dict() and b.call_index == 1
    assert b.prompt_ids[: len(a.prompt_ids) + len(a.sampled_ids)] == a.prompt_ids + a.sampled_ids


def test_store_evicts_idle_sessions_from_memory_and_reloads_them(tmp_path):
    from polar.gateway.sessions import SessionStore
    from polar.types import CallRecord

    store = SessionStore(tmp_path, max_sessions_in_memory=2)

    def rec(sid: str) -> CallRecord:
        i = store.next_call_index(sid)
        return CallRecord(sid, i, "openai_chat", "tiny", [{"role": "user", "content": sid}], [1, 2], [3], [-0.5],
                          "stop", 0, 0.0, 1.0, metadata={"reuse_key": f"{i:032x}"})

    for sid in ("a", "b", "c", "a"):
        store.append(rec(sid))
    assert len(store._sessions) == 2
    assert [r.call_index for r in store.records("a")] == [0, 1]
    assert [r.messages[0]["content"] for r in store.records("b")] == ["b"]  # reloaded from its file
    assert store.next_call_index("b") == 1 and store.lookup("c", bytes(16)) is not None
    assert store.session_ids() == ["a", "b", "c"]
