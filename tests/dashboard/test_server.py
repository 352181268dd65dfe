"""The dashboard's API on bad input: corrupt and half-written metrics, missing runs, huge sessions, paths
outside the runs folder; LTTB and the incremental index."""

from __future__ import annotations

import json
import os

import httpx
import numpy as np
import pytest

from polar.dashboard.metrics_index import MetricsIndex, lttb
from tests.dashboard.conftest import append_rows, make_run


def test_lttb_keeps_ends_and_extremes():
    x = np.arange(100_000, dtype=float)
    y = np.sin(x / 500)
    y[31_337], y[77_001] = 50.0, -40.0  # spikes a plain stride would miss
    dx, dy = lttb(x, y, 500)
    assert len(dx) == 500 and dx[0] == 0 and dx[-1] == x[-1]
    assert np.all(np.diff(dx) > 0)
    assert 50.0 in dy and -40.0 in dy
    sx, _ = lttb(x[:10], y[:10], 500)  # fewer points than asked: all of them
    assert len(sx) == 10


def test_index_reads_only_complete_lines_and_counts_corrupt_ones(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"env_steps": 1, "r": 1.0}\n{"env_steps": 2, "r": 2.0}\nnot json at all\n[1, 2]\n'
                 '{"env_steps": 3, "r": NaN}\n{"env_steps": 4, "r"')  # a row still being written
    idx = MetricsIndex(p)
    idx.update()
    assert idx.rows == 3 and idx.skipped == 2  # the NaN row counts (NaN values are dropped), the torn line waits
    assert idx.curve("r") == [[1.0, 1.0], [2.0, 2.0]]
    with open(p, "a") as f:
        f.write(': 4.0}\n')  # the writer finishes the line
    new = idx.update()
    assert new["r"] == [[4.0, 4.0]] and idx.curve("r")[-1] == [4.0, 4.0]
    assert idx.update() == {}  # nothing new: nothing re-read
    p.write_text('{"env_steps": 10, "r": 5.0}\n')  # a resumed run cut rows: the file shrank
    idx.update()
    assert idx.rows == 1 and idx.curve("r") == [[10.0, 5.0]]


def test_index_incremental_equals_whole(tmp_path):
    p = tmp_path / "metrics.jsonl"
    rows = [{"step": i, "loss": float(np.cos(i / 50)), "x": i % 7} for i in range(5000)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    p.write_text(text)
    whole = MetricsIndex(p)
    whole.update_all()
    p.write_text("")
    inc = MetricsIndex(p)
    for i in range(0, len(text), 997):  # appended in odd-sized pieces, mid-line
        with open(p, "a") as f:
            f.write(text[i:i + 997])
        inc.update(max_bytes=4096)
    inc.update_all()
    assert inc.rows == whole.rows == 5000
    assert inc.curve("loss", 300) == whole.curve("loss", 300)


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    good = make_run(root / "good")
    append_rows(good, [{"env_steps": i * 10, "episode_reward_mean": float(i)} for i in range(50)])
    with open(good / "metrics.jsonl", "a") as f:
        f.write('{"env_steps": 500, "episode_rew')  # half-written
    bad = make_run(root / "torn")
    (bad / "run.json").write_text('{"status": "runn')  # run.json torn mid-write
    (bad / "metrics.jsonl").write_bytes(b'\x00\xff garbage\n{"env_steps": 1, "fps": 3}\n')
    (tmp_path / "secret.txt").write_text("TOP-SECRET-CONTENT")
    os.symlink(tmp_path / "secret.txt", good / "link.txt")
    return root


def test_bad_runs_show_what_they_can(runs, serve):
    srv = serve(runs)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        body = http.get("/api/runs").json()
        by_id = {r["id"]: r for r in body["runs"]}
        assert by_id["good"]["status"] == "finished"
        assert by_id["torn"]["status"] == "unknown" and "run.json" in by_id["torn"]["problem"]
        c = http.get("/api/curves", params={"run": "good", "keys": "episode_reward_mean,nope"}).json()
        assert len(c["curves"]["episode_reward_mean"]) == 50 and c["missing"] == ["nope"]
        t = http.get("/api/curves", params={"run": "torn", "keys": "fps"}).json()
        assert t["curves"]["fps"] == [[1.0, 3.0]] and t["skipped"] == 1
        r = http.get("/api/curves", params={"run": "no-such-run", "keys": "fps"})
        assert r.status_code == 404 and "no-such-run" in r.json()["error"]
        r = http.get("/api/curves", params={"keys": "fps"})
        assert r.status_code == 400 and "'run' is required" in r.json()["error"]
        r = http.get("/api/curves", params={"run": "good", "keys": "fps", "n": "1"})
        assert r.status_code == 400 and "'n'" in r.json()["error"]
        r = http.get("/api/session", params={"run": "good", "id": "ses-nope"})
        assert r.status_code == 404
        assert http.get("/api/runs").status_code == 200  # still serving


@pytest.mark.parametrize("path", ["/files/../secret.txt", "/files/%2e%2e/secret.txt", "/files/good/../../secret.txt",
                                  "/files/good/link.txt", "/files//etc/passwd", "/files/good/%2e%2e/%2e%2e/secret.txt"])
def test_no_file_outside_the_runs_folder(runs, serve, path):
    srv = serve(runs)
    r = httpx.get(srv.url + path, timeout=30)
    assert r.status_code in (403, 404), (path, r.status_code)
    assert "TOP-SECRET-CONTENT" not in r.text and "root:" not in r.text


def test_no_traversal_through_query_arguments(runs, serve):
    srv = serve(runs)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.get("/api/keys", params={"run": "../"}).status_code == 404
        r = http.get("/api/episode", params={"run": "good", "tag": "../../..", "ep": "secret.txt"})
        assert r.status_code in (403, 404) and "TOP-SECRET" not in r.text
        r = http.get("/api/report", params={"id": "../"})
        assert r.status_code in (403, 404) and "TOP-SECRET" not in r.text
        ok = http.get("/files/good/run.json")
        assert ok.status_code == 200 and ok.json()["status"] == "finished"


def test_huge_and_corrupt_sessions(tmp_path, serve):
    """A 60k-token session shows its first tokens and says how many it left out; a corrupt index line is
    skipped and reported."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from polar.trajectory.io import to_arrow
    from polar.types import TrajectorySample

    run = make_run(tmp_path / "runs" / "agent", kind="agentic-grpo")
    n = 60_000
    s = TrajectorySample("ses-big", list(range(n)), [i % 2 for i in range(n)], [-0.5] * n, [3] * n, [0] * n, 1.0)
    (run / "sessions" / "trajectories").mkdir(parents=True)
    table = to_arrow([s]).append_column("token_text", pa.array([[f"t{i}" for i in range(n)]]))
    pq.write_table(table, run / "sessions" / "trajectories" / "b.parquet")
    with open(run / "sessions" / "index.jsonl", "w") as f:
        f.write(json.dumps({"session_id": "ses-big", "status": "done", "reward": 1.0, "step": 1,
                            "trajectory": "trajectories/b.parquet", "records": "gateway/sessions"}) + "\n")
        f.write("{corrupt\n")
        f.write(json.dumps({"session_id": "ses-x", "status": "error", "trajectory": "../../../../etc/passwd"}) + "\n")
    srv = serve(tmp_path / "runs")
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        lst = http.get("/api/sessions", params={"run": "agent"}).json()
        assert lst["total"] == 2 and "1 corrupt lines" in lst["note"]
        big = http.get("/api/session", params={"run": "agent", "id": "ses-big"}).json()
        smp = big["samples"][0]
        assert len(smp["token_ids"]) == 20_000 and smp["tokens_total"] == n
        assert any("40000 are not" in note for note in big["notes"])
        assert any("no call records" in note for note in big["notes"])
        x = http.get("/api/session", params={"run": "agent", "id": "ses-x"})
        assert x.status_code == 200 and x.json()["samples"] == []
        assert any("outside the runs folder" in note for note in x.json()["notes"])


def test_big_chunks_read_columnwise_fall_back_on_a_bad_line(tmp_path):
    """A chunk of many rows goes through Arrow's JSON reader; one corrupt line (or NaN) in it sends the chunk
    through the row-by-row reader instead, with the same result for the good rows."""
    rows = [{"env_steps": i, "loss": i / 10, "ok": i % 2 == 0, "name": "x"} for i in range(2000)]
    lines = [json.dumps(r) for r in rows]
    clean, dirty = tmp_path / "clean.jsonl", tmp_path / "dirty.jsonl"
    clean.write_text("\n".join(lines) + "\n")
    dirty.write_text("\n".join([*lines[:1000], '{"env_steps": 5, "loss": NaN}', "{torn", *lines[1000:]]) + "\n")
    a, b = MetricsIndex(clean), MetricsIndex(dirty)
    a.update_all()
    b.update_all()
    assert (a.rows, a.skipped) == (2000, 0) and (b.rows, b.skipped) == (2001, 1)
    assert a.series["loss"].n == b.series["loss"].n == 2000  # the NaN value is left out
    assert a.curve("loss", 2000) == b.curve("loss", 2000) == [[float(i), i / 10] for i in range(2000)]
    ok = a.series["ok"]
    assert ok.n == 2000 and ok.y[: ok.n].sum() == 1000  # booleans are 0/1 curves
    assert "name" not in a.series and a.last_row == rows[-1]
