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


def test_polar_gateway_serves_with_the_action_cache_from_its_config(tmp_path):
    """Serving: `polar gateway --config` with action_cache answers a repeated greedy prompt from the cache (its
    /health counts the hit) and refuses a sampled one with a 400 naming temperature."""
    (tmp_path / "gw.yaml").write_text("model: tiny\naction_cache: {max_entries: 8}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar.cli.main", "gateway", "--config", str(tmp_path / "gw.yaml"), "--port", "0",
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
        body = {"model": "tiny", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
        answers = [httpx.post(f"{url}/s/c{i}/v1/chat/completions", json=body, timeout=120).json() for i in range(2)]
        assert answers[0]["choices"][0]["message"] == answers[1]["choices"][0]["message"]
        cache = httpx.get(f"{url}/health", timeout=10).json()["action_cache"]
        assert (cache["hits"], cache["misses"], cache["max_entries"]) == (1, 1, 8)
        hot = httpx.post(f"{url}/s/hot/v1/chat/completions", json={**body, "temperature": 1.0}, timeout=120)
        assert hot.status_code == 400 and hot.json()["error"]["param"] == "temperature"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
