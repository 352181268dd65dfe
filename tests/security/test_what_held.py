"""What held when issue 31's attacker tried it, kept as tests so it keeps holding: markup in run data never runs
in the dashboard, YAML tags in a run folder's config construct nothing, an ONNX export cannot pull external data
from outside its folder. Real processes, a real browser, real onnxruntime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polar.trainers.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def polar(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.cli.main", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_markup_in_a_runs_data_never_runs_in_the_dashboard(tmp_path):
    """A run's session ids, task ids, outputs, events and rating comments come from the agent (or whoever
    wrote the folder); the page shows them as text."""
    from playwright.sync_api import sync_playwright

    from polar.dashboard.server import DashboardServer
    from tests.dashboard.conftest import chromium_path

    runs = tmp_path / "runs"
    rd = RunDir.create("agent", run_dir=runs / "agent", kind="agentic-grpo")
    rd.update_meta(status="finished", error=XSS)
    (rd.path / "sessions").mkdir()
    (rd.path / "sessions" / "index.jsonl").write_text(json.dumps(
        {"session_id": "ses-1", "task_id": XSS, "status": XSS, "reward": 1.0, "step": 0, "output": XSS,
         "error": XSS}) + "\n")
    (rd.path / "events.jsonl").write_text(json.dumps({"time": 0, "kind": XSS, "message": XSS}) + "\n")
    (rd.path / "ratings.jsonl").write_text(json.dumps(
        {"kind": "session", "target": "ses-1", "score": 1, "comment": XSS, "time": 0}) + "\n")
    (rd.path / "metrics.jsonl").write_text(json.dumps({"step": 1, XSS: 1.0}) + "\n")
    srv = DashboardServer(runs).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            page.goto(f"{srv.url}/?run=agent")
            for tab in ("curves", "events", "ratings", "sessions"):
                page.click(f'button[data-tab="{tab}"]')
                page.wait_for_timeout(300)
            page.wait_for_selector("tr[data-session]")
            page.click('tr[data-session="ses-1"]')
            page.wait_for_timeout(500)
            assert page.evaluate("window.__xss") is None
            assert page.locator("#tab-sessions img").count() == 0
            assert "onerror" in page.inner_text("#tab-sessions")  # shown, as text
            # the probe works: the same markup put in as HTML does run
            page.evaluate(f"document.body.insertAdjacentHTML('beforeend', {json.dumps(XSS)})")
            page.wait_for_function("window.__xss === 1", timeout=5000)
            browser.close()
    finally:
        srv.stop()


def test_python_yaml_tags_in_a_run_folder_config_construct_nothing(tmp_path):
    """A run folder is data: ``!!python/object/apply`` in its config.resolved.yaml (or in an override) is a
    malformed-YAML error, not a call."""
    marker = tmp_path / "pwned"
    run = RunDir.create("evil", run_dir=tmp_path / "evil", kind="ppo")
    run.config_path.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\n"
                               "harness: {type: gymnasium, id: CartPole-v1}\npolicy: {type: ppo}\n")
    res = polar("eval", run.path, cwd=tmp_path)
    assert res.returncode == 1 and not marker.exists(), res.stderr[-2000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "malformed YAML" in errors[0] and "python/object/apply" in errors[0], res.stderr
    res = polar("run", "--config", ROOT / "examples" / "cartpole_ppo.yaml", "--run-dir", tmp_path / "r",
                "-o", f"name=!!python/object/apply:os.system ['touch {marker}']", cwd=tmp_path)
    assert res.returncode != 0 and not marker.exists(), res.stderr[-2000:]


def test_an_onnx_export_cannot_read_external_data_outside_its_folder(tmp_path):
    """An export is data from anyone: an initializer stored as external data at ``../../secret.bin`` must not
    load (onnxruntime refuses the path), and ``polar serve`` says the export is broken."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from polar.deploy.export import export_run
    from polar.errors import DeployError
    from tests.deploy.conftest import run_config, write_run

    run = write_run(tmp_path / "run", run_config("cartpole"))
    out = tmp_path / "models" / "cartpole" / "1"
    export_run(run.path, out, samples=8)
    manifest = json.loads((out / "manifest.json").read_text())
    model_path = out / manifest["file"]
    model = onnx.load(str(model_path))
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    raw = numpy_helper.to_array(init)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(raw.astype(raw.dtype).tobytes())  # a file of the right size, outside the export
    init.ClearField("raw_data")
    init.ClearField("float_data")
    init.data_location = onnx.TensorProto.EXTERNAL
    del init.external_data[:]
    for k, v in (("location", os.path.relpath(secret, out)), ("offset", "0"), ("length", str(raw.nbytes))):
        entry = init.external_data.add()
        entry.key, entry.value = k, v
    onnx.save(model, str(model_path))

    from polar.deploy.runtime import load_export

    with pytest.raises(DeployError) as err:
        load_export(out)
    assert "escapes model directory" in str(err.value), err.value
    res = polar("serve", out.parent, "--port", "0", cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-2000:]
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("error:")], res.stderr[-2000:]


def test_twenty_back_to_back_connector_runs_leave_nothing_behind(tmp_path, monkeypatch):
    """Twenty key-door runs through their connector, one after another in one process: no child process, no
    connector socket folder, no extra thread or file descriptor is left behind by any of them."""
    import shutil
    import tempfile
    import threading

    import psutil
    import yaml

    from polar.config import load_config
    from polar.trainers.build import build_trainer

    src = ROOT / "examples" / "keydoor"
    game = tmp_path / "game"
    game.mkdir()
    for f in ("keydoor_game.py", "my_game_connector.py", "polar_agent_definition.py"):
        shutil.copy(src / f, game / f)
    cfg = yaml.safe_load((src / "demo.yaml").read_text())
    cfg.update(total_env_steps=64, eval={"at_end": False},
               logging={"checkpoint_freq": 1, "tensorboard": False, "progress_bar": False})
    cfg["distribution"]["envs_per_worker"] = 2
    cfg["policy"]["kwargs"]["n_steps"] = 32
    (game / "c.yaml").write_text(yaml.safe_dump(cfg))
    me = psutil.Process()
    sockets_dir = tmp_path / "tmp"  # this test's own temp folder: other processes' sockets are not counted
    sockets_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(sockets_dir))
    before_dirs: set[Path] = set()
    seen: list[tuple[int, int]] = []
    # processes of this pytest session that were there before (a session's Ray cluster or vLLM server), and
    # whatever they spawn, are not the runs'
    base = {p.pid for p in me.children(recursive=True)}

    def left_behind() -> list[psutil.Process]:
        out = []
        for p in me.children(recursive=True):
            try:
                tree = {p.pid, *(a.pid for a in p.parents())}
            except psutil.NoSuchProcess:
                continue
            if not tree & base:
                out.append(p)
        return out

    for i in range(20):
        run = RunDir.create(f"r{i}", tmp_path / "runs" / f"r{i}")
        build_trainer(load_config(game / "c.yaml"), run).train()
        assert list(run.checkpoints_dir.glob("ckpt_*")), f"run {i} wrote no checkpoint"
        assert left_behind() == [], f"run {i} left {left_behind()}"
        assert set(sockets_dir.glob("polar-conn-*")) == before_dirs, f"run {i} left its socket folder"
        seen.append((threading.active_count(), me.num_fds()))
    threads, fds = zip(*seen, strict=True)
    assert max(threads[1:]) <= threads[1] and max(fds[1:]) <= fds[1] + 2, seen  # the first run warms caches up
