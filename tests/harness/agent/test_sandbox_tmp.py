"""The sandbox's own /tmp and /dev/shm: writable by the sandbox user (``nobody`` when polar is root), capped,
and never the host's; /dev/null still works (a connector's supervisor is started with stdin=/dev/null)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from polar.harness.agent.sandbox import NOBODY, bwrap_args, bwrap_unusable, setpriv_args

pytestmark = pytest.mark.skipif(bool(bwrap_unusable()), reason="needs bubblewrap")

FILL = """
echo ok > /dev/null && echo "/dev/null writable"
for d in /tmp /dev/shm; do
  touch $d/{name} && echo "$d writable"
  head -c 3000000 /dev/zero > $d/big 2>/dev/null || echo "$d full at $(stat -c %s $d/big)"
done
"""


def test_sandbox_tmp_and_shm_are_the_sandbox_users_own_and_capped(tmp_path: Path) -> None:
    name = f"polar-tmp-probe-{uuid.uuid4().hex}"
    argv = bwrap_args(rw=[str(tmp_path)], ro=[], unshare_net=True, chdir=str(tmp_path), tmp_size_mb=1, shm_size_mb=1)
    if os.geteuid() == 0:
        os.chown(tmp_path, NOBODY, NOBODY)
        argv += setpriv_args(NOBODY)
    res = subprocess.run([*argv, "sh", "-c", FILL.format(name=name)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "/dev/null writable" in res.stdout  # the tmpfs mounts leave --dev's device nodes alone
    for d in ("/tmp", "/dev/shm"):
        assert f"{d} writable" in res.stdout
        full = [line for line in res.stdout.splitlines() if line.startswith(f"{d} full at ")]
        assert full and int(full[0].split()[-1]) <= 1 << 20, res.stdout  # the 1 MiB cap, not the 3 MB written
        assert not Path(d, name).exists()  # the sandbox's own tmpfs: nothing reaches the host's
    assert list(tmp_path.iterdir()) == []
