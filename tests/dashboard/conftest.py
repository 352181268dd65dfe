"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright's Python package).

``playwright install`` cannot download browsers here, so the tests launch the system binary
(``POLAR_CHROMIUM`` overrides its path). Screenshots go to ``test-artifacts/dashboard/`` (gitignored) and
are checked to be non-blank."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"


def chromium_path() -> str:
    path = os.environ.get("POLAR_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).is_file():
        pytest.fail(f"no chromium at {path}: install Debian's chromium (apt-get install -y chromium; .ci/run does) "
                    "or point POLAR_CHROMIUM at a Chromium binary", pytrace=False)
    return path


@pytest.fixture(scope="module")  # Playwright's sync API holds an event loop on this thread while open: close it with the module, or every later asyncio.run() fails
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors
    yield pg
    ctx.close()
    assert not errors, f"the page raised: {errors}"


def screenshot(page, name: str) -> Path:
    """Save a screenshot as a test artifact and check it is not blank (its pixels vary)."""
    import numpy as np
    from PIL import Image

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    px = np.asarray(Image.open(path).convert("L"), dtype=np.float64)
    assert px.std() > 10, f"screenshot {path} is blank (pixel std {px.std():.1f})"
    return path


@pytest.fixture
def serve():
    """``serve(root, token=None)``: a dashboard on 127.0.0.1 (a free port) on a thread; stopped after the test."""
    from polar.dashboard.server import DashboardServer

    servers = []

    def start(root, token=None):
        s = DashboardServer(root, ratings_token=token).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def make_run(path: Path, name: str = "run", status: str = "finished", kind: str = "ppo") -> Path:
    """A run directory as ``RunDir.create`` writes one (run.json, checkpoints/, eval/)."""
    from polar.trainers.run_dir import RunDir

    rd = RunDir.create(name, run_dir=path, kind=kind)
    rd.update_meta(status=status)
    return rd.path


def append_rows(path: Path, rows: list[dict]) -> None:
    """Rows appended the way ``MetricsLogger`` writes them: one JSON object per line, line-buffered."""
    with open(path / "metrics.jsonl", "a", buffering=1) as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def wait_for(cond, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
