"""System metrics of a real process tree, structured logs across processes, and the metric-sink interface."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polar.metrics.logger import MetricsLogger, read_metrics
from polar.metrics.logs import install_run_logging, read_logs, remove_run_logging, trace
from polar.metrics.sinks import build_sink, register_sink
from polar.metrics.system import StageTimer, SystemSampler, register_process


def _child(code: str, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)


def test_sampler_names_children_by_role_and_measures_them():
    import os

    busy = _child("import sys\nx = bytearray(64 * 1024 * 1024)\nprint('ready', flush=True)\nwhile True: pass")
    env = dict(os.environ, POLAR_ROLE="connector")
    idle = _child("import sys, time\nprint('ready', flush=True)\ntime.sleep(60)", env=env)
    try:
        assert busy.stdout.readline().strip() == "ready" and idle.stdout.readline().strip() == "ready"
        register_process(busy.pid, "rollout_worker")
        sampler = SystemSampler("learner", interval_s=0.2, gpu=False)
        sampler.sample()
        deadline = time.monotonic() + 30
        snap = {}
        while time.monotonic() < deadline:  # CPU% is measured between samples: wait for a busy reading
            time.sleep(0.3)
            snap = sampler.sample()
            if snap.get("system/rollout_worker-0/cpu_percent", 0) > 10:
                break
        assert snap["system/rollout_worker-0/cpu_percent"] > 10
        assert snap["system/rollout_worker-0/rss_mb"] > 60  # the 64 MiB it holds
        assert snap["system/connector-0/rss_mb"] > 1  # named by its POLAR_ROLE
        assert snap["system/connector-0/cpu_percent"] < snap["system/rollout_worker-0/cpu_percent"]
        assert "system/learner/rss_mb" in snap and "system/learner/io_read_mb" in snap
        assert snap["system/processes"] >= 3
        assert 0 <= snap["system/host/cpu_percent"] <= 100 * 1024
        assert not any(k.startswith("system/gpu") for k in snap)  # gpu=False
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
    snap = sampler.sample()  # the dead ones are gone, not reported stale
    assert "system/rollout_worker-0/cpu_percent" not in snap


def test_a_child_seen_before_its_exec_is_renamed_by_its_new_command_line():
    """A process first sampled between fork and exec shows its parent's command line; once it execs into
    a connector it must be reported as one, not keep its first name for life."""
    code = ("import os, sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"
            "os.execv(sys.executable, [sys.executable, '-c', 'import time; print(1, flush=True); time.sleep(60)', "
            "'polar.harness.' + 'connector'])")  # split: the pre-exec command line must not name it
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        sampler = SystemSampler("learner", interval_s=0.2, gpu=False)

        def named(snap: dict, role: str) -> int:  # counts: the suite's own children (shared servers) may hold index 0
            return sum(1 for k in snap if k.startswith(f"system/{role}-") and k.endswith("/rss_mb"))

        before = sampler.sample()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "1"  # the exec'd program runs
        after = sampler.sample()
        assert named(after, "connector") == named(before, "connector") + 1
        assert named(after, "child") == named(before, "child") - 1
    finally:
        child.kill()
        child.wait()


def test_sampler_thread_snapshot_lands_in_metrics_jsonl_and_tensorboard(tmp_path):
    sampler = SystemSampler("learner", interval_s=0.05, gpu=False).start()
    try:
        deadline = time.monotonic() + 30
        while not sampler.snapshot() and time.monotonic() < deadline:
            time.sleep(0.02)
        snap = sampler.snapshot()
    finally:
        sampler.stop()
    assert snap
    timer = StageTimer()
    with timer.stage("collect"):
        time.sleep(0.01)
    timer.add("learn", 0.5)
    timer.add("learn", 0.25)
    logger = MetricsLogger(tmp_path / "metrics.jsonl", tmp_path / "tb")
    logger.log({"step": 1, **snap, **timer.pop()}, 1)
    logger.close()
    row = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert row["time/learn_s"] == 0.75 and row["time/collect_s"] >= 0.01
    assert row["system/learner/rss_mb"] == pytest.approx(snap["system/learner/rss_mb"])
    assert timer.pop() == {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert "system/learner/rss_mb" in acc.Tags()["scalars"]


def test_sampler_rejects_a_bad_interval():
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        SystemSampler(interval_s=0)


def test_structured_logs_from_two_processes_are_searchable_by_role_and_trace(tmp_path):
    handler = install_run_logging(tmp_path, "learner", run_id="run-1")
    try:
        log = logging.getLogger("polar.test")
        with trace("w0-1-abcd"):
            log.info("fragment collected slowly")
        log.warning("plain line")
    finally:
        remove_run_logging(handler)
    root = str(Path(__file__).resolve().parents[2])
    code = (f"import logging, sys; sys.path.insert(0, {root!r})\n"
            "from polar.metrics.logs import install_run_logging, trace\n"
            f"install_run_logging({str(tmp_path)!r}, 'rollout_worker', run_id='run-1')\n"
            "with trace('w0-1-abcd'):\n    logging.getLogger('polar.worker').info('sent fragment')\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    (tmp_path / "logs" / "rollout_worker-1.jsonl").write_text('{"ts": 1, "msg": "torn')  # a torn line is skipped
    files = sorted(p.name.split("-")[0] for p in (tmp_path / "logs").glob("*.jsonl"))
    assert files == ["learner", "rollout_worker", "rollout_worker"]
    traced = read_logs(tmp_path, trace_id="w0-1-abcd")
    assert [r["role"] for r in traced] == ["learner", "rollout_worker"]
    assert {r["run_id"] for r in traced} == {"run-1"} and all(r["node"] and r["pid"] for r in traced)
    assert [r["msg"] for r in read_logs(tmp_path, query="PLAIN")] == ["plain line"]
    assert read_logs(tmp_path, role="rollout_worker")[0]["msg"] == "sent fragment"
    line = json.loads((tmp_path / "logs").glob("learner-*.jsonl").__next__().read_text().splitlines()[1])
    assert line["level"] == "WARNING" and line["trace_id"] is None


class FakeSink:
    """An in-process sink: what a W&B / MLflow sink would have been handed."""

    instances: list[FakeSink] = []

    def __init__(self, run_name, run_dir=None, fail_after=None):
        self.run_name, self.rows, self.closed, self.fail_after = run_name, [], False, fail_after
        FakeSink.instances.append(self)

    def log(self, row, step):
        if self.fail_after is not None and len(self.rows) >= self.fail_after:
            raise ConnectionError("tracker unreachable")
        self.rows.append((step, dict(row)))

    def close(self):
        self.closed = True


def test_metric_sinks_receive_every_row_and_a_failing_one_is_dropped(tmp_path, caplog):
    register_sink("fake", FakeSink)
    good = build_sink("fake", run_name="r")
    bad = build_sink("fake", run_name="r", fail_after=1)
    logger = MetricsLogger(tmp_path / "m.jsonl", sinks=[good, bad])
    for step in range(3):
        logger.log({"reward": float(step), "system/learner/rss_mb": 10.0}, step)
    logger.close()
    assert [s for s, _ in good.rows] == [0, 1, 2] and good.rows[2][1]["reward"] == 2.0
    assert len(bad.rows) == 1 and "tracker unreachable" in caplog.text
    assert good.closed and not bad.closed  # dropped at its failure, never closed by the logger afterwards
    assert len(read_metrics(tmp_path / "m.jsonl")) == 3  # the JSONL has every row


def test_unknown_sink_and_missing_library_say_what_to_do():
    from polar.errors import ConfigError

    with pytest.raises(ConfigError, match=r"metric sink 'wandbb' is unknown; known sinks: .*wandb"):
        build_sink("wandbb", run_name="r")
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"pip install 'polar-rl\[wandb\]'"):
            build_sink("wandb", run_name="r")


def test_sink_libraries_are_not_imported_unless_configured():
    code = ("import sys; import polar.metrics.sinks, polar.metrics.logger, polar.metrics.system\n"
            "bad = [m for m in ('wandb', 'mlflow', 'opentelemetry', 'pynvml') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_otel_sink_records_gauges_through_the_api():
    pytest.importorskip("opentelemetry.metrics")
    sink = build_sink("otel", run_name="r")
    sink.log({"reward": 1.5, "note": "text is skipped"}, 3)
    assert list(sink.gauges) == ["reward"]
    sink.close()


def test_log_level_comes_from_polar_log_level(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_LOG_LEVEL", "DEBUG")
    handler = install_run_logging(tmp_path, "rollout_worker")
    try:
        logging.getLogger("polar.rollout.worker").debug("fragment %s", "w0-1-ab", extra={"trace_id": "w0-1-ab"})
    finally:
        remove_run_logging(handler)
        logging.getLogger("polar").setLevel(logging.NOTSET)
    assert [(r["level"], r["trace_id"]) for r in read_logs(tmp_path)] == [("DEBUG", "w0-1-ab")]
