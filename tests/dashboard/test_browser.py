"""The dashboard in headless Chromium: a live run's curve grows while the page is open, a key-door episode
replays, a session's token trace marks the trainable tokens, and a rating round-trips to disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from tests.dashboard.conftest import append_rows, make_run, screenshot, wait_for

REPO = Path(__file__).resolve().parents[2]
KEYDOOR = REPO / "examples" / "keydoor" / "demo.yaml"


def polar(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "polar.cli.main", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def rows_of(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def test_live_keydoor_run_then_episode_replay(tmp_path, serve, page):
    runs = tmp_path / "runs"
    run = runs / "keydoor"
    # small iterations (2 copies x 16 steps) so rows arrive often; pixels: the connector also sends the picture
    proc = polar("run", "--config", str(KEYDOOR), "--run-dir", str(run), "--no-progress",
                 "-o", "harness.connector_spec.config.pixels=true", "-o", "distribution.envs_per_worker=2",
                 "-o", "policy.kwargs.n_steps=16", "-o", "policy.kwargs.num_minibatches=1",
                 "-o", "policy.kwargs.n_epochs=1", "-o", "total_env_steps=1000000", "-o", "logging.checkpoint_freq=0")
    try:
        wait_for(lambda: len(rows_of(run / "metrics.jsonl")) >= 1 or proc.poll() is not None, 120, "the first metrics row")
        assert proc.poll() is None, proc.stdout.read()
        srv = serve(runs)
        page.goto(f"{srv.url}/?run=keydoor")
        chart = 'canvas.chart[data-key="fps"]'
        page.wait_for_selector(chart)
        page.wait_for_function(f"document.querySelector('{chart}').dataset.points > 0", timeout=30_000)
        # both read in one evaluation: an update landing between two reads would pair a new count with an old x
        first_x, first_n = page.evaluate(f"(() => {{ const c = document.querySelector('{chart}'); "
                                         "return [parseFloat(c.dataset.lastX), parseInt(c.dataset.points)]; })()")
        # the curve grows over server-sent events while the page stays open (no reload)
        page.wait_for_function(f"parseFloat(document.querySelector('{chart}').dataset.lastX) > {first_x}",
                               timeout=60_000)
        assert int(page.get_attribute(chart, "data-points")) > first_n
        assert page.evaluate("window.__polar.updates") >= 1
        logged = rows_of(run / "metrics.jsonl")
        assert float(page.get_attribute(chart, "data-last-x")) <= logged[-1]["env_steps"]
        assert page.inner_text('#runs .run[data-run="keydoor"] .badge') == "running"
        screenshot(page, "live_curve")
    finally:
        proc.send_signal(signal.SIGTERM)  # the run writes a final checkpoint and says interrupted
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    page.wait_for_function("document.querySelector('#runs .run[data-run=\"keydoor\"] .badge').textContent "
                           "=== 'interrupted'", timeout=30_000)

    from polar.cli.main import main

    assert main(["eval", str(run), "--episodes", "1", "--record", "1", "--trust-code"]) == 0  # in process; its own connector
    index = json.loads(next((run / "episodes").glob("*/index.json")).read_text())
    ep = index["episodes"][0]
    assert ep["frames"] == "png" and ep["length"] >= 1
    steps = rows_of(run / "episodes" / index["tag"] / ep["id"] / "steps.jsonl")
    assert len(steps) == ep["length"] + 1 and steps[0]["action"] is None and steps[1]["action"] in (0, 1, 2, 3)

    page.click('#tabs button[data-tab="episodes"]')
    page.click(f'tr[data-episode="{index["tag"]}/{ep["id"]}"]')
    page.wait_for_function("(() => { const i = document.querySelector('#frame'); return i && i.complete && "
                           "i.naturalWidth === 112; })()", timeout=30_000)  # 7x7 cells of 16 px
    assert page.get_attribute("#frame-info", "data-frame") == "0"
    if ep["length"] >= 2:
        page.click("#play")
        page.wait_for_function("+document.querySelector('#frame-info').dataset.frame >= 2", timeout=30_000)
    page.fill("#frame-slider", str(ep["length"]))
    info = page.inner_text("#frame-info")
    assert f"frame {ep['length']} / {ep['length']}" in info and f"action {steps[-1]['action']}" in info
    assert page.get_attribute("#frame", "src").endswith(f"f_{ep['length']:05d}.png")
    screenshot(page, "episode_replay")


@pytest.fixture(scope="module")
def agent_run_once(tmp_path_factory):
    """An agent run's directory as a GRPO run leaves it: sessions run through the real pipeline (scripted
    calculator model, the calculator agent, its verifier) and recorded by the LocalStack's session store."""
    from polar.harness.agent.runners import CallableRunner
    from polar.harness.agent.verifiers import UserFunction
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings
    from tests.agent_support.helpers import EXAMPLES, oracle_script

    tmp_path = tmp_path_factory.mktemp("agent")
    run = make_run(tmp_path / "runs" / "agent", name="calculator-grpo", kind="agentic-grpo")
    tok = build_tiny_tokenizer()
    engine = ScriptedEngine.tiny(oracle_script(tok, wrong_every=2))  # every other answer is off by one
    settings = PipelineSettings(agent_timeout_s=120, workspace_root=str(tmp_path / "ws"), max_run_workers=4)
    tasks = [json.loads(line) for line in (EXAMPLES / "train.jsonl").read_text().splitlines()[:2]]
    with LocalStack(engine, CallableRunner("calculator_agent:agent", EXAMPLES), UserFunction("verifier:verify", EXAMPLES),
                    settings, records_dir=run / "gateway" / "sessions", results_dir=run / "sessions") as stack:
        groups = stack.run_groups([(t, 2, {"rollout_step": 0}) for t in tasks])
    rewards = [r.reward for g in groups for r in g]
    append_rows(run, [{"step": 1, "policy_version": 1, "reward_mean": sum(rewards) / len(rewards)},
                      {"step": 2, "policy_version": 2, "reward_mean": 0.75}])
    return run, groups


@pytest.fixture
def agent_run(agent_run_once, tmp_path):
    """A fresh copy of the agent run for each test (ratings are written into it)."""
    import shutil

    run, groups = agent_run_once
    copy = tmp_path / "runs" / "agent"
    shutil.copytree(run, copy)
    return copy, groups


def test_session_trace_and_rating_round_trip(agent_run, serve, page, tmp_path):
    run, groups = agent_run
    index = rows_of(run / "sessions" / "index.jsonl")
    assert len(index) == 4 and {r["step"] for r in index} == {1}
    srv = serve(run.parent)
    page.goto(f"{srv.url}/?run=agent")
    chart = 'canvas.chart[data-key="reward_mean"]'
    page.wait_for_function(f"document.querySelector('{chart}') && document.querySelector('{chart}').dataset.points == 2")
    # the link: click the curve's point at step 1, get the sessions collected for it
    y_val = sum(r.reward for g in groups for r in g) / 4
    px = page.evaluate(f"(() => {{ const s = document.querySelector('{chart}')._scale; "
                       f"return [s.sx(1), s.sy({y_val})]; }})()")
    box = page.locator(chart).bounding_box()
    page.mouse.click(box["x"] + px[0], box["y"] + px[1])
    page.wait_for_selector("#tab-sessions:not([hidden]) tr[data-session]")
    assert "4 sessions at step 1" in page.inner_text("#sessions-info")

    first = index[0]
    sid = first["session_id"]
    page.click(f'tr[data-session="{sid}"]')
    page.wait_for_selector("#session-detail .trace .tok")
    table = pq.read_table(run / "sessions" / first["trajectory"]).to_pylist()
    mine = [r for r in table if r["session_id"] == sid]
    trainable = sum(sum(r["loss_mask"]) for r in mine)
    total = sum(len(r["token_ids"]) for r in mine)
    assert trainable > 0
    assert page.locator("#session-detail .tok.trainable").count() == trainable
    assert page.locator("#session-detail .tok").count() == total
    assert page.locator("#session-detail tr[data-call]").count() == first["num_calls"]
    tip = page.get_attribute("#session-detail .tok.trainable >> nth=0", "title")
    assert "logprob -" in tip or "logprob 0" in tip
    assert "policy v0" in tip
    bg = page.evaluate("getComputedStyle(document.querySelector('#session-detail .tok.trainable')).backgroundColor")
    plain = page.evaluate("getComputedStyle(document.querySelector('#session-detail .tok:not(.trainable)')).backgroundColor")
    assert bg != plain  # trainable tokens are highlighted
    page.locator("#session-detail .tok.trainable").first.scroll_into_view_if_needed()
    screenshot(page, "session_trace")

    # a rating round-trips to disk
    page.select_option("#session-detail .rate-score", "5")
    page.fill("#session-detail .rate-comment", "right answer, short")
    page.click("#session-detail .rate-save")
    page.wait_for_selector("#session-detail .rate-status[data-saved]")
    saved = rows_of(run / "ratings.jsonl")
    assert len(saved) == 1
    r = saved[0]
    assert (r["kind"], r["target"], r["score"], r["comment"]) == ("session", sid, 5.0, "right answer, short")
    assert r["task_id"] == first["task_id"] and r["reward"] == first["reward"]
    assert r["id"] == page.get_attribute("#session-detail .rate-status", "data-saved")

    # a second rating of the same task, lower: a preference pair, and an agreement with the verifier
    other = next(x for x in index if x["task_id"] == first["task_id"] and x["session_id"] != sid)
    resp = httpx.post(f"{srv.url}/api/ratings", params={"run": "agent"}, timeout=30,
                      json={"kind": "session", "target": other["session_id"], "score": 2, "comment": ""})
    assert resp.status_code == 200, resp.text
    page.click('#tabs button[data-tab="ratings"]')
    page.wait_for_selector("#agreement")
    text = page.inner_text("#agreement")
    if first["reward"] != other["reward"]:
        agree = (first["reward"] > other["reward"])
        assert f"{100 if agree else 0}% agree over 1 pairs" in text
    else:
        assert "no comparable pairs" in text
    screenshot(page, "ratings")

    from polar.cli.main import main

    out = tmp_path / "prefs.jsonl"
    assert main(["ratings", "export", str(run), "--out", str(out)]) == 0
    pairs = rows_of(out)
    assert len(pairs) == 1
    p = pairs[0]
    assert (p["task_id"], p["chosen_id"], p["rejected_id"]) == (first["task_id"], sid, other["session_id"])
    assert p["chosen_score"] == 5.0 and p["rejected_score"] == 2.0
    assert p["chosen"] == first["output"] and "What is" in p["prompt"]
    pq_out = tmp_path / "prefs.parquet"
    assert main(["ratings", "export", str(run), "--out", str(pq_out), "--format", "parquet"]) == 0
    assert pq.read_table(pq_out).to_pylist()[0]["chosen_id"] == sid


def test_ratings_need_the_token_when_one_is_set(agent_run, serve):
    run, _ = agent_run
    token = "tok-" + "s3cr3t-value"
    srv = serve(run.parent, token=token)
    sid = rows_of(run / "sessions" / "index.jsonl")[0]["session_id"]
    body = {"kind": "session", "target": sid, "score": 4, "comment": "ok"}
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        r = http.post("/api/ratings", params={"run": "agent"}, json=body)
        assert r.status_code == 401 and "token" in r.json()["error"]
        r = http.post("/api/ratings", params={"run": "agent"}, json=body, headers={"x-polar-token": "wrong"})
        assert r.status_code == 401
        assert not (run / "ratings.jsonl").exists()
        for bad, field in (({**body, "score": 9}, "'score'"), ({**body, "kind": "x"}, "'kind'"),
                           ({**body, "target": "ses-nope"}, "not found"), ({**body, "comment": 3}, "'comment'")):
            r = http.post("/api/ratings", params={"run": "agent"}, json=bad, headers={"x-polar-token": token})
            assert r.status_code in (400, 404) and field in r.json()["error"], (bad, r.text)
        r = http.post("/api/ratings", params={"run": "agent"}, json=body, headers={"x-polar-token": token})
        assert r.status_code == 200
    assert len(rows_of(run / "ratings.jsonl")) == 1
    for f in run.rglob("*"):  # the token never reaches disk
        if f.is_file():
            assert token.encode() not in f.read_bytes(), f


def test_resources_events_reports_and_logs(tmp_path, serve, page):
    """What other parts of polar write shows on its tab: ``system/`` and ``time/`` metrics, restart counters and
    scale events, an evaluation suite's report.json (docs/evaluation.md, format 1), structured logs."""
    runs = tmp_path / "runs"
    run = make_run(runs / "ray", status="running")
    append_rows(run, [{"env_steps": 100 * i, "episode_reward_mean": float(i), "connector/process_restarts": float(i >= 3),
                       "rollout/scale_events": float(i >= 5), "system/learner/cpu_percent": 50.0 + i,
                       "system/rollout_worker-0/rss_mb": 200.0 + i, "time/collect_s": 0.5} for i in range(8)])
    (run / "scale_events.jsonl").write_text(json.dumps({"time": 1.0, "env_steps": 500, "from": 2, "to": 4,
                                                        "reason": "queue depth 12 > 8"}) + "\n")
    (run / "logs").mkdir()
    (run / "logs" / "learner-42.jsonl").write_text(
        json.dumps({"ts": 1.0, "level": "INFO", "role": "learner", "pid": 42, "msg": "iteration 3 done"}) + "\n"
        + json.dumps({"ts": 2.0, "level": "WARNING", "role": "learner", "pid": 42, "msg": "connector-0 restarted"}) + "\n")
    rep = runs / "reports" / "smoke"
    rep.mkdir(parents=True)
    (rep / "report.json").write_text(json.dumps({
        "format": 1, "suite": "smoke", "interval": {"method": "bootstrap", "level": 0.95},
        "results": [{"harness": "cartpole-noisy", "policy": "early", "n": 20, "error": None,
                     "metrics": {"return": {"mean": 21.3, "low": 18.0, "high": 25.1, "std": 7.9, "n": 20}}},
                    {"harness": "cartpole-noisy", "policy": "late", "n": 20, "error": None,
                     "metrics": {"return": {"mean": 480.5, "low": 470.0, "high": 491.0, "std": 9.0, "n": 20}}}]}))
    (rep / "report.html").write_text("<html><body>report</body></html>")
    srv = serve(runs)
    page.goto(f"{srv.url}/?run=ray&tab=resources")
    for key in ("system/learner/cpu_percent", "system/rollout_worker-0/rss_mb", "time/collect_s"):
        page.wait_for_function(f"document.querySelector('#res-charts canvas[data-key=\"{key}\"]')?.dataset.points == 8")
    screenshot(page, "resources")
    page.click('#tabs button[data-tab="events"]')
    page.wait_for_selector("#events tr.event")
    text = page.inner_text("#events")
    assert "connector/process_restarts" in text and "+1 (total 1)" in text
    assert "queue depth 12 > 8" in text and "rollout/scale_events" in text
    assert page.locator("#events tr.event").count() == 3
    page.click('#tabs button[data-tab="reports"]')
    page.click("#reports-list tr.row")
    page.wait_for_selector("#report-table")
    table = page.inner_text("#report-table")
    assert "480.5 [470, 491]" in table and "21.3 [18, 25.1]" in table
    assert page.get_attribute('#report a[href$="report.html"]', "href") == "/files/reports/smoke/report.html"
    page.click('#tabs button[data-tab="logs"]')
    page.fill("#log-q", "restarted")
    page.press("#log-q", "Enter")
    page.wait_for_function("document.querySelectorAll('#logs tr.log').length === 1")
    assert "connector-0 restarted" in page.inner_text("#logs")
