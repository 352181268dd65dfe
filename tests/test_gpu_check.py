"""benchmarks/gpu_check.py --dry: each of issue 35's four GPU points runs its CPU-sized equivalent end to end and
says so in one line (learner group on gloo with 2 processes, vLLM's weight-transfer request bodies against vLLM's own
router, a GRPO step on a config-built model, the metrics sampler's no-GPU keys). No timing is asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POINTS = ("learner group", "weight transfer", "GRPO 0.5B", "GPU metrics")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *args], capture_output=True,
                          text=True, timeout=240, env=env, cwd=ROOT)


def test_dry_gpu_check_runs_every_point_on_cpu():
    p = _run("--dry")
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    lines = [ln.strip() for ln in p.stdout.splitlines() if re.match(r"\s+(ok|n/a|skipped|FAIL): ", ln)]
    assert [ln.split(": ")[1] for ln in lines] == list(POINTS), p.stdout  # one line per point, in order
    by_point = {ln.split(": ")[1]: ln for ln in lines}
    assert by_point["GRPO 0.5B"].startswith("ok: "), p.stdout
    assert "config-built Qwen2" in by_point["GRPO 0.5B"]
    assert by_point["GPU metrics"].startswith("ok: ") and "no system/gpu* keys" in by_point["GPU metrics"]
    group = by_point["learner group"]
    from polar.config.sections import DistributionConfig

    if "num_learners" in DistributionConfig.model_fields:  # once the learner group is on the tree it must run
        assert group.startswith("ok: ") and "2 ranks on gloo" in group, group
    else:
        assert group.startswith("n/a: ") and "not available on this tree" in group, group
    vllm = by_point["weight transfer"]
    if (ROOT / ".vllm-venv" / "bin" / "python").exists():
        assert vllm.startswith("ok: ") and "accepted by vLLM's RL router" in vllm, vllm
    else:
        assert vllm.startswith("skipped: ") and ".vllm-venv" in vllm, vllm
    assert "passed" in p.stdout.splitlines()[-1]


def test_gpu_check_without_cuda_and_without_dry_checks_nothing_and_says_so():
    p = _run()
    assert p.returncode == 0, p.stderr[-3000:]
    assert "CUDA is not available" in p.stdout and "--dry" in p.stdout
