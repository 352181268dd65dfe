"""`make test` on a fresh machine without bubblewrap and chromium: as root it installs them with apt-get; as a
user without sudo it stops at once with the one command that installs them. `.ci/run` goes through it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bin(tmp_path: Path, uid: int, apt_log: Path | None = None) -> Path:
    """A PATH with make, bash, a fake `id` and (for root) a fake apt-get; no bwrap, no chromium, no sudo."""
    b = tmp_path / "bin"
    b.mkdir()
    for tool in ("make", "bash", "env"):
        (b / tool).symlink_to(shutil.which(tool))
    (b / "id").write_text(f"#!{shutil.which('bash')}\necho {uid}\n")
    if apt_log is not None:
        (b / "apt-get").write_text(f"#!{shutil.which('bash')}\necho \"$@\" >> {apt_log}\n")
    else:
        (b / "apt-get").write_text(f"#!{shutil.which('bash')}\nexit 100\n")
    for f in b.iterdir():
        if not f.is_symlink():
            f.chmod(0o755)
    return b


def _make(path: Path, target: str = "system-deps") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "POLAR_SKIP_SYSTEM_DEPS"}
    env["PATH"] = str(path)
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), target], capture_output=True, text=True,
                          env=env, timeout=30)


def test_make_test_without_root_stops_at_once_with_the_apt_command(tmp_path):
    p = _make(_bin(tmp_path, uid=1000))
    assert p.returncode != 0
    assert "install them with: sudo apt-get install -y bubblewrap chromium" in p.stderr, p.stderr


def test_make_test_as_root_installs_them_with_apt(tmp_path):
    log = tmp_path / "apt.log"
    p = _make(_bin(tmp_path, uid=0, apt_log=log))
    assert p.returncode == 0, p.stderr
    assert log.read_text().split() == ["install", "-y", "-q", "bubblewrap", "chromium"]


def test_make_test_and_ci_run_check_the_system_packages_first():
    dry = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), "test"], capture_output=True,
                         text=True, timeout=30)
    assert dry.stdout.splitlines()[0] == "bash .ci/system-deps", dry.stdout[:500]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
