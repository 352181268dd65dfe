"""SIGKILL `polar run` mid-training, then `polar resume`: the run continues from its last checkpoint
and still solves CartPole within the same 150k-step budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CARTPOLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole_ppo.yaml"


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the killed process may have left half a line
    return out


def test_sigkill_then_resume_reaches_the_target(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "polar.cli.main", "run", "--config", str(CARTPOLE), "--run-dir", str(run),
           "--no-progress", "-o", "logging.checkpoint_freq=10", "-o", "total_env_steps=150000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            rows = _rows(run / "metrics.jsonl")
            if (run / "checkpoints" / "LATEST").exists() and rows and rows[-1]["iteration"] >= 25:
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        else:
            raise AssertionError("no checkpoint within 600 s")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    rows_before = _rows(run / "metrics.jsonl")
    assert rows_before[-1]["episode_reward_mean"] < 475  # killed mid-training, not after solving
    ckpt_iter = int((run / "checkpoints" / "LATEST").read_text().strip()[5:13])
    assert json.loads((run / "run.json").read_text())["status"] == "running"

    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "resume", str(run), "--no-progress"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = _rows(run / "metrics.jsonl")
    assert rows[:ckpt_iter] == rows_before[:ckpt_iter]  # rows after the checkpoint were cut, not repeated
    resumed = rows[ckpt_iter:]
    assert resumed[0]["iteration"] == ckpt_iter + 1  # continued from the checkpoint, not from scratch
    assert resumed[0]["env_steps"] == (ckpt_iter + 1) * 256
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "finished"
    assert meta["result"]["episode_reward_mean"] >= 475 and meta["result"]["env_steps"] <= 150_000
