"""``polar dashboard`` and ``polar ratings export`` as commands: defaults, announcements, one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx

from tests.dashboard.conftest import append_rows, make_run


def test_dashboard_command_listens_on_loopback_and_stops_on_ctrl_c(tmp_path):
    run = make_run(tmp_path / "runs" / "r1")
    append_rows(run, [{"env_steps": 8, "fps": 1.0}])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "POLAR_DASHBOARD_TOKEN": "from-env"}
    proc = subprocess.Popen([sys.executable, "-m", "polar.cli.main", "dashboard", str(tmp_path / "runs"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # printed once the socket listens
        assert line.startswith("polar dashboard: serving ") and " at http://127.0.0.1:" in line, line
        url = line.rsplit(" at ", 1)[1].strip().rstrip("/")
        body = httpx.get(f"{url}/api/runs", timeout=30).json()
        assert [r["id"] for r in body["runs"]] == ["r1"] and body["ratings_token"] is True
        page = httpx.get(url + "/", timeout=30)
        assert page.status_code == 200 and "/static/app.js" in page.text
        js = httpx.get(url + "/static/app.js", timeout=30)
        assert js.status_code == 200 and "EventSource" in js.text  # the assets ship inside the package
        assert "http" not in page.text.replace(url, "").lower().split("<body>")[0]  # no CDN
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_dashboard_and_export_errors(tmp_path, capsys):
    from polar.cli.main import main

    assert main(["dashboard", str(tmp_path / "nope"), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "runs folder" in err and "does not exist" in err
    run = make_run(tmp_path / "runs" / "r1")
    assert main(["ratings", "export", str(run), "--out", str(tmp_path / "p.jsonl")]) == 1
    assert "has no ratings" in capsys.readouterr().err
    assert main(["ratings", "export", str(tmp_path), "--out", str(tmp_path / "p.jsonl")]) == 1
    assert "not a polar run directory" in capsys.readouterr().err
