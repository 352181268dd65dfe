"""Where suite jobs run: a job past its time is an error row and its process is gone; Ray tasks give the
same numbers as local processes."""

from __future__ import annotations

import psutil
import pytest
import yaml

from polar.evaluation.runner import run_suite
from polar.evaluation.suite import load_suite
from tests.evaluation.helpers import EXAMPLES, make_env_run


def _suite(tmp_path, run, **parallel):
    data = {"name": "p", "parallel": parallel,
            "policies": [{"name": "a", "run": str(run)}, {"name": "b", "checkpoint":
                                                          str(run / "checkpoints" / "ckpt_00000001.pt")}],
            "harnesses": [{"name": "c", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
                           "wrappers": [{"type": "action_repeat", "times": 2}],
                           "seeds": {"start": 10**6, "count": 4}}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    return load_suite(tmp_path / "s.yaml")


def test_a_job_past_its_time_is_an_error_row_and_leaves_no_process(tmp_path):
    run = make_env_run(tmp_path / "run", EXAMPLES / "cartpole_ppo.yaml", seeds=(1, 2))
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    report = run_suite(_suite(tmp_path, run, workers=1, job_timeout_s=0.01), tmp_path / "out")
    errors = [r["error"] for r in report["results"]]
    assert len(errors) == 2 and all(e and e.startswith("timed out: the suite did not finish within "
                                                       "parallel.job_timeout_s = 0.01 s") for e in errors)
    assert (tmp_path / "out" / "report.md").read_text().count("error: timed out") == 2
    # multiprocessing's resource tracker is one per interpreter and ends with it; the job processes must be gone
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before and c.is_running()
            and c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(c.cmdline())]
    assert not left, [c.cmdline() for c in left]


@pytest.mark.ray
@pytest.mark.slow
def test_ray_tasks_give_the_numbers_of_local_processes(tmp_path):
    run = make_env_run(tmp_path / "run", EXAMPLES / "cartpole_ppo.yaml", seeds=(1, 2))
    local = run_suite(_suite(tmp_path, run, workers=2), tmp_path / "local")
    ray_report = run_suite(_suite(tmp_path, run, backend="ray", workers=2), tmp_path / "ray")
    for a, b in zip(local["results"], ray_report["results"], strict=True):
        assert a["error"] is None and b["error"] is None
        assert [e["return"] for e in a["episodes"]] == [e["return"] for e in b["episodes"]]
        assert a["metrics"]["return"] == b["metrics"]["return"]
