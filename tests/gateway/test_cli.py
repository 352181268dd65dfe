"""``polar gateway``: config loading (strict keys) and a real server process."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from polar.cli.gateway_cmd import load_config
from polar.errors import ConfigError


def _args(**kw) -> argparse.Namespace:
    base = {"config": None, "model": None, "host": None, "port": None, "records_dir": None, "admin_token": None}
    return argparse.Namespace(**{**base, **kw})


def test_config_from_a_run_file_with_flag_overrides(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("gateway:\n  model: tiny\n  model_aliases: [gpt-4o]\n  pause_mode: reject\n")
    c = load_config(_args(config=str(cfg), port=8123, records_dir=str(tmp_path / "r")))
    assert (c.model, c.model_aliases, c.pause_mode, c.port, c.host) == ("tiny", ["gpt-4o"], "reject", 8123, "127.0.0.1")
    assert c.records_dir == str(tmp_path / "r")


def test_unknown_config_key_names_the_fix(tmp_path):
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("model: tiny\nmax_body_byte: 10\n")
    with pytest.raises(ConfigError, match=r"max_body_byte.*did you mean: max_body_bytes"):
        load_config(_args(config=str(cfg)))


def test_polar_gateway_process_serves_and_stops_on_sigint(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar.cli.main", "gateway", "--model", "tiny", "--port", "0",
         "--records-dir", str(tmp_path / "records")],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = None
        deadline = time.monotonic() + 240
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, "the gateway did not report its address"
        r = httpx.post(f"{url}/s/cli/v1/chat/completions", timeout=120,
                       json={"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert (tmp_path / "records" / "cli.jsonl").read_text().count("\n") == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
