"""Sessions are owned by the API key that created them, keys never reach disk, ids may hold '/', and a
gateway restarted on a used records directory continues it only when told to."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from polar.config.gateway import GatewayConfig
from polar.errors import GatewayError
from polar.gateway.server import GatewayServer
from polar.gateway.sessions import key_session_id, session_key

A, B, ADMIN = "sk-live-alice-0123456789", "sk-live-bob-9876543210", "admin-s3cret"
MSGS = [{"role": "user", "content": "hi"}]


def _oa(url: str, key: str, **kw):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, **kw)


def _get(url: str, path: str, key: str | None = None, admin: bool = False) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    if admin:
        headers["x-polar-admin-token"] = ADMIN
    return httpx.get(url + path, headers=headers, timeout=60)


def test_sessions_belong_to_the_key_that_created_them(gateway, scripted):
    import anthropic
    import openai
    from google import genai
    from google.genai import errors as genai_errors
    from google.genai import types

    gw = gateway(scripted(lambda req, i: "ok"), admin_token=ADMIN)
    url = gw.url
    _oa(f"{url}/s/shared", A).chat.completions.create(model="tiny", messages=MSGS)
    _oa(f"{url}/s/shared", A).chat.completions.create(model="tiny", messages=MSGS)  # the owner appends
    # another key appends to nobody's session but its own, whichever provider it speaks
    with pytest.raises(openai.PermissionDeniedError) as e:
        _oa(f"{url}/s/shared", B).chat.completions.create(model="tiny", messages=MSGS)
    assert "belongs to another API key" in e.value.message
    with pytest.raises(anthropic.PermissionDeniedError):
        anthropic.Anthropic(base_url=f"{url}/s/shared", api_key=B, max_retries=0).messages.create(
            model="tiny", max_tokens=4, messages=MSGS)
    gem = genai.Client(api_key=B, http_options=types.HttpOptions(base_url=f"{url}/s/shared", api_version="v1beta"))
    with pytest.raises(genai_errors.ClientError) as ge:
        gem.models.generate_content(model="tiny", contents="hi")
    assert ge.value.code == 403
    with pytest.raises(openai.PermissionDeniedError):  # the admin token is no key to someone else's session
        _oa(f"{url}/s/shared", ADMIN).chat.completions.create(model="tiny", messages=MSGS)
    assert len(gw.records("shared")) == 2  # the refused calls left no record

    _oa(url, B).chat.completions.create(model="tiny", messages=MSGS)  # B's key names B's own session
    b_session = key_session_id(B)

    # reads: the owner and the admin; nobody else, and no key at all is nobody
    assert [r["call_index"] for r in _get(url, "/sessions/shared", A).json()["records"]] == [0, 1]
    assert _get(url, "/sessions/shared/trajectory", A).status_code == 200
    assert _get(url, "/sessions/shared", admin=True).status_code == 200
    for who in (B, None):
        assert _get(url, "/sessions/shared", who).status_code == 403
        assert _get(url, "/sessions/shared/trajectory", who).status_code == 403
    assert _get(url, f"/sessions/{b_session}", B).json()["session_id"] == b_session
    assert _get(url, f"/sessions/{b_session}", A).status_code == 403
    assert _get(url, f"/sessions/{B}", B).json()["session_id"] == b_session  # a key as the id names its session

    # listings: the caller's own sessions (the admin's: all), never a key
    assert _get(url, "/sessions", A).json() == {"sessions": ["shared"]}
    assert _get(url, "/sessions", B).json() == {"sessions": [b_session]}
    assert _get(url, "/sessions", admin=True).json() == {"sessions": sorted(["shared", b_session])}
    assert _get(url, "/sessions").status_code == 401
    for path in ("/sessions", "/sessions/shared", f"/sessions/{b_session}"):
        text = _get(url, path, admin=True).text
        assert A not in text and B not in text


def test_without_an_admin_token_the_gateway_is_open(gateway, scripted):
    gw = gateway(scripted(lambda req, i: "ok"))
    _oa(f"{gw.url}/s/open", A).chat.completions.create(model="tiny", messages=MSGS)
    _oa(f"{gw.url}/s/open", B).chat.completions.create(model="tiny", messages=MSGS)
    assert len(_get(gw.url, "/sessions/open", B).json()["records"]) == 2
    assert _get(gw.url, "/sessions").json() == {"sessions": ["open"]}


def test_api_keys_never_reach_disk(gateway, scripted):
    import anthropic
    from google import genai
    from google.genai import types

    gw = gateway(scripted(lambda req, i: "ok"), admin_token=ADMIN)
    keys = {name: f"sk-secret-{name}-{'x' * 12}" for name in ("oa", "ant", "gem", "query", "prefixed")}
    _oa(gw.url, keys["oa"]).chat.completions.create(model="tiny", messages=MSGS)
    _oa(gw.url, keys["oa"]).responses.create(model="tiny", input="hi")
    anthropic.Anthropic(base_url=gw.url, api_key=keys["ant"], max_retries=0).messages.create(
        model="tiny", max_tokens=4, messages=MSGS)
    gem = genai.Client(api_key=keys["gem"], http_options=types.HttpOptions(base_url=gw.url, api_version="v1beta"))
    gem.models.generate_content(model="tiny", contents="hi")
    r = httpx.post(f"{gw.url}/v1beta/models/tiny:generateContent", params={"key": keys["query"]}, timeout=60,
                   json={"contents": [{"parts": [{"text": "hi"}]}]})
    assert r.status_code == 200
    _oa(f"{gw.url}/s/named", keys["prefixed"]).chat.completions.create(model="tiny", messages=MSGS)
    # a failed call is recorded too
    _oa(gw.url, keys["oa"]).chat.completions.with_raw_response.create(model="tiny", messages=MSGS, max_tokens=10**9)
    gw.flush()

    files = sorted(gw.app.store.dir.rglob("*"))
    assert len(files) == 5  # one session per key, plus the named one
    for key in keys.values():
        assert all(key not in p.name for p in files)
        assert all(key.encode() not in p.read_bytes() for p in files), key
    # the owner still finds its session: by the key (in-process) and over HTTP
    assert len(gw.records(keys["oa"])) >= 2
    assert _get(gw.url, "/sessions", keys["ant"]).json() == {"sessions": [key_session_id(keys["ant"])]}


def test_a_session_key_names_its_session_openly(gateway, scripted):
    """Polar's rollouts give harnesses ``session_key(id)``: not a credential, so the session keeps its name."""
    gw = gateway(scripted(lambda req, i: "ok"), admin_token=ADMIN)
    key = session_key("task7-attempt2")
    _oa(gw.url, key).chat.completions.create(model="tiny", messages=MSGS)
    (rec,) = gw.records("task7-attempt2")
    assert rec.session_id == "task7-attempt2" and gw.records(key) == [rec]
    assert _get(gw.url, "/sessions/task7-attempt2", key).json()["records"][0]["session_id"] == "task7-attempt2"
    assert _get(gw.url, "/sessions/task7-attempt2", B).status_code == 403


def test_session_ids_with_a_slash_are_readable(gateway, scripted):
    gw = gateway(scripted(lambda req, i: "ok"))
    _oa(gw.url, "k", default_headers={"x-polar-session": "run1/task7"}).chat.completions.create(model="tiny", messages=MSGS)
    _oa(f"{gw.url}/s/run1%2Ftask8", "k").chat.completions.create(model="tiny", messages=MSGS)
    for sid, path in (("run1/task7", "run1%2Ftask7"), ("run1/task8", "run1%2Ftask8"), ("run1/task7", "run1/task7")):
        r = httpx.get(f"{gw.url}/sessions/{path}", timeout=60)
        assert r.status_code == 200 and r.json()["session_id"] == sid, r.text
        assert [rec["session_id"] for rec in r.json()["records"]] == [sid]
        t = httpx.get(f"{gw.url}/sessions/{path}/trajectory", timeout=60)
        assert t.status_code == 200 and len(t.json()["samples"]) == 1
        assert httpx.get(f"{gw.url}/s/other/sessions/{path}", timeout=60).json()["session_id"] == sid
    assert {"run1/task7", "run1/task8"} <= set(httpx.get(f"{gw.url}/sessions", timeout=60).json()["sessions"])
    r = httpx.get(f"{gw.url}/sessions/run1%2Ftask9", timeout=60)
    assert r.status_code == 404 and "'run1/task9'" in r.json()["error"]["message"]


def test_a_used_records_directory_needs_resume_records(tmp_path, scripted):
    records = tmp_path / "records"
    cfg = GatewayConfig(admin_token=ADMIN)
    with GatewayServer(cfg, scripted(lambda req, i: "ok"), records) as gw:
        _oa(f"{gw.url}/s/run1%2Ftask7", A).chat.completions.create(model="tiny", messages=MSGS)
    with pytest.raises(GatewayError, match=r"already holds 1 session\(s\).*--resume-records.*another --records-dir"):
        GatewayServer(cfg, scripted(lambda req, i: "ok"), records)
    assert len(list(records.glob("*.jsonl"))) == 1
    cfg = GatewayConfig(admin_token=ADMIN, resume_records=True)
    with GatewayServer(cfg, scripted(lambda req, i: "again"), records) as gw:
        import openai

        # ownership, listing and call indices continue across the restart
        assert _get(gw.url, "/sessions", A).json() == {"sessions": ["run1/task7"]}
        with pytest.raises(openai.PermissionDeniedError):
            _oa(f"{gw.url}/s/run1%2Ftask7", B).chat.completions.create(model="tiny", messages=MSGS)
        _oa(f"{gw.url}/s/run1%2Ftask7", A).chat.completions.create(model="tiny", messages=MSGS)
        assert [r.call_index for r in gw.records("run1/task7")] == [0, 1]


def test_polar_gateway_refuses_a_used_records_directory_in_one_line(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    (records / "old.jsonl").write_text("{}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400"}
    proc = subprocess.run([sys.executable, "-m", "polar.cli.main", "gateway", "--model", "tiny", "--port", "0",
                           "--records-dir", str(records)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--resume-records" in errors[0] and str(records) in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "listening" not in proc.stderr


def test_resume_records_flag_reaches_the_config(tmp_path):
    import argparse

    from polar.cli.gateway_cmd import add_arguments, load_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert load_config(parser.parse_args(["--records-dir", str(tmp_path), "--resume-records"])).resume_records is True
    assert load_config(parser.parse_args(["--records-dir", str(tmp_path)])).resume_records is False
