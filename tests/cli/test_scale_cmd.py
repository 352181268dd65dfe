"""``polar scale``: writes a request the driver's watcher picks up; refuses what it cannot do."""

import subprocess
import sys

import pytest

from polar.distributed.control import ScaleWatcher, read_applied


def polar(*args):
    return subprocess.run([sys.executable, "-m", "polar.cli.main", *map(str, args)], capture_output=True, text=True, timeout=60)


def test_scale_request_reaches_the_watcher(tmp_path):
    (tmp_path / "config.resolved.yaml").write_text("distribution: {backend: ray}\n")
    watcher = ScaleWatcher(tmp_path, poll_interval_s=0.0)
    assert watcher.poll() is None
    r = polar("scale", tmp_path, "--rollout-workers", 3)
    assert r.returncode == 0, r.stderr
    assert watcher.poll() == 3
    assert watcher.poll() is None  # applied once
    watcher.applied(3)
    assert read_applied(tmp_path)["rollout_workers"] == 3


def test_scale_refuses_local_backend_and_missing_dirs(tmp_path):
    (tmp_path / "config.resolved.yaml").write_text("distribution: {backend: local}\n")
    r = polar("scale", tmp_path, "--rollout-workers", 2)
    assert r.returncode == 1 and "only the ray backend" in r.stderr
    r = polar("scale", tmp_path / "nope", "--rollout-workers", 2)
    assert r.returncode == 1 and "no such run directory" in r.stderr


@pytest.mark.parametrize("text", ["{", '{"rollout_workers": "many"}', '{"rollout_workers": 0}'])
def test_watcher_ignores_malformed_requests(tmp_path, text):
    watcher = ScaleWatcher(tmp_path, poll_interval_s=0.0)
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "scale.json").write_text(text)
    assert watcher.poll() is None


def test_the_resume_command_scale_recommends_for_a_local_run_works(tmp_path):
    import re
    from pathlib import Path

    import yaml

    cartpole = Path(__file__).resolve().parents[2] / "examples" / "cartpole_ppo.yaml"
    run = tmp_path / "local"
    r = polar("run", "--config", cartpole, "--run-dir", run, "--no-progress", "-o", "total_env_steps=256",
              "-o", "eval.at_end=false")
    assert r.returncode == 0, r.stderr[-3000:]
    r = polar("scale", run, "--rollout-workers", 2)
    assert r.returncode == 1
    recommended = re.search(r"`(polar resume [^`]+)`", " ".join(r.stderr.split()))
    assert recommended, r.stderr
    words = recommended.group(1).split()
    assert words[:3] == ["polar", "resume", str(run)]
    r = polar(*words[1:])
    assert r.returncode == 0, r.stderr[-3000:]
    assert yaml.safe_load((run / "config.resolved.yaml").read_text())["distribution"]["rollout_workers"] == 2
