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
