"""`make test`'s two xdist workers (tests/xdist_groups.py): a file is one unit of work, and every test of a
session-wide resource (vLLM replica, Ray cluster, coding-CLI install) runs on one worker, in collection order.
Checked on a small suite of its own, run by a real `pytest -n 2 --dist loadgroup`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
import pytest
from tests.xdist_groups import pytest_collection_finish, pytest_xdist_make_scheduler  # noqa: F401

@pytest.fixture(scope="session")
def ray_cluster():
    return "cluster"
"""
# four files with a vllm-marked test each, two using the Ray fixture, and plain tests with a module fixture
VLLM_FILE = """
import pytest

@pytest.mark.vllm
def test_served_{n}():
    pass

def test_plain_{n}_a(): pass
def test_plain_{n}_b(): pass
"""
RAY_FILE = """
def test_on_the_cluster_{n}(ray_cluster):
    assert ray_cluster == "cluster"
"""
PLAIN_FILE = """
import pytest

@pytest.fixture(scope="module")
def built():
    return object()

""" + "".join(f"def test_{i}(built): pass\n" for i in range(6))


def test_files_and_shared_resources_each_run_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm: a real vLLM server\n")
    for n in range(4):
        (tmp_path / f"test_served_{n}.py").write_text(VLLM_FILE.format(n=n))
    for n in range(2):
        (tmp_path / f"test_ray_{n}.py").write_text(RAY_FILE.format(n=n))
    for n in range(4):
        (tmp_path / f"test_plain_{n}.py").write_text(PLAIN_FILE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
                        str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", p.stdout, re.M)
    assert len(ran) == 4 * 3 + 2 + 4 * 6, p.stdout[-3000:]
    assert {w for w, _ in ran} == {"gw0", "gw1"}  # both workers got work
    workers = defaultdict(set)
    for worker, nodeid in ran:
        unit = "vllm" if "::test_served_" in nodeid else "ray" if "test_ray_" in nodeid else nodeid.split("::")[0]
        workers[unit].add(worker)
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    served = [nodeid for _, nodeid in ran if "::test_served_" in nodeid]
    assert served == sorted(served)  # the shared resource's tests in collection order
