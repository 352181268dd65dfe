"""A run store of many sessions: the dashboard's sessions table pages without parsing every row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboard.conftest import make_run


class CountingJson:
    """Stands in for the ``json`` module inside ``polar.dashboard.runs``: counts the rows it parses."""

    def __init__(self) -> None:
        self.loads_calls = 0

    def loads(self, s: Any) -> Any:
        self.loads_calls += 1
        return json.loads(s)

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


def write_index(run: Path, n: int, start: int = 0) -> None:
    (run / "sessions").mkdir(exist_ok=True)
    pad = "x" * 400  # realistic row sizes: n rows pass the paging threshold
    with open(run / "sessions" / "index.jsonl", "a") as f:
        for i in range(start, start + n):
            f.write(json.dumps({"session_id": f"s{i:06d}", "status": "done", "reward": 1.0, "step": i // 100,
                                "output": pad}) + "\n")
            if i % 1000 == 7:
                f.write("\n")  # blank lines are not sessions


def test_first_page_of_a_big_session_store_parses_only_that_page(tmp_path, serve, monkeypatch):
    from polar.dashboard import runs

    run = make_run(tmp_path / "runs" / "agent", kind="agentic-grpo")
    n = 12_000
    write_index(run, n)
    assert (run / "sessions" / "index.jsonl").stat().st_size > runs.PAGED_INDEX_BYTES
    counting = CountingJson()
    monkeypatch.setattr(runs, "json", counting)
    srv = serve(tmp_path / "runs")
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        first = http.get("/api/sessions", params={"run": "agent", "offset": 0, "limit": 100}).json()
        assert first["total"] == n and [r["session_id"] for r in first["rows"]] == [f"s{i:06d}" for i in range(100)]
        assert counting.loads_calls <= 100, f"{counting.loads_calls} rows parsed for a page of 100"
        far = http.get("/api/sessions", params={"run": "agent", "offset": n - 50, "limit": 100}).json()
        assert [r["session_id"] for r in far["rows"]] == [f"s{i:06d}" for i in range(n - 50, n)]
        write_index(run, 10, start=n)  # sessions appended while the dashboard is open
        more = http.get("/api/sessions", params={"run": "agent", "offset": n, "limit": 100}).json()
        assert more["total"] == n + 10 and len(more["rows"]) == 10 and more["rows"][0]["session_id"] == f"s{n:06d}"
        assert counting.loads_calls <= 100 + 50 + 10
        assert first["rows"][0]["output"] == "x" * 200  # the table's rows are cut as before


@pytest.mark.parametrize("offset", [0, 5])
def test_small_session_store_pages_from_parsed_rows(tmp_path, serve, offset):
    """Below the paging threshold every row is parsed: the total leaves corrupt lines out, as before."""
    run = make_run(tmp_path / "runs" / "agent", kind="agentic-grpo")
    write_index(run, 10)
    with open(run / "sessions" / "index.jsonl", "a") as f:
        f.write("{corrupt\n")
    srv = serve(tmp_path / "runs")
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        page = http.get("/api/sessions", params={"run": "agent", "offset": offset, "limit": 3}).json()
    assert page["total"] == 10 and "1 corrupt lines" in page["note"]
    assert [r["session_id"] for r in page["rows"]] == [f"s{i:06d}" for i in range(offset, offset + 3)]


def test_line_index_skips_blank_and_whitespace_lines_and_waits_for_a_torn_one():
    from polar.dashboard.runs import _line_starts

    data = b'{"a": 1}\n\n   \n  {"b": 2}\n\t\r\n{"c": 3}\n{"torn'
    assert _line_starts(data).tolist() == [0, 14, 28]
    assert _line_starts(b"").tolist() == [] and _line_starts(b"no newline yet").tolist() == []


def test_line_index_read_in_small_chunks_finds_every_row(tmp_path, monkeypatch):
    """Chunks end mid-line, and one line is longer than a chunk: the index is the same as in one read."""
    from polar.dashboard import runs

    run = make_run(tmp_path / "runs" / "agent", kind="agentic-grpo")
    write_index(run, 300)
    with open(run / "sessions" / "index.jsonl", "a") as f:
        f.write(json.dumps({"session_id": "long", "output": "z" * 5000}) + "\n")
    write_index(run, 20, start=300)
    monkeypatch.setattr(runs, "INDEX_CHUNK_BYTES", 1000)
    tail = runs.JsonlTail(run / "sessions" / "index.jsonl")
    rows, total = tail.page(295, 10)
    assert total == 321 and [r["session_id"] for r in rows] == [*(f"s{i:06d}" for i in range(295, 300)), "long",
                                                                  *(f"s{i:06d}" for i in range(300, 304))]
