"""A run that dies and is resumed: real `polar run` / `polar resume` subprocesses on CartPole.

- SIGKILL after a checkpoint and after more metrics rows, then resume: no iteration twice in
  metrics.jsonl, and TensorBoard's steps never go back.
- A corrupt newest checkpoint: resume falls back to the one before it and says so.
- A run directory made read-only, or a write that fails mid-file: one error line naming the path and the
  cause, earlier checkpoints intact, no temporary files left.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from polar.trainers.checkpoint import CheckpointManager, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "examples" / "cartpole_ppo.yaml"
STEPS_PER_ITER = 256  # 8 envs x n_steps 32
FOREVER = ["-o", "total_env_steps=100000000", "-o", "stop_reward=null", "-o", "eval.at_end=false",
           "-o", "policy.kwargs.n_epochs=2"]


def polar(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "polar.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def rows_of(run: Path) -> list[dict]:
    out = []
    path = run / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a killed process may leave half a line
    return out


def checkpoint_iterations(run: Path) -> list[int]:
    return sorted(int(p.stem[5:]) for p in (run / "checkpoints").glob("ckpt_*.pt"))


def wait_for(pred, proc: subprocess.Popen, err_path: Path, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        assert proc.poll() is None, f"polar run exited {proc.returncode} before {what}:\n{err_path.read_text()[-3000:]}"
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def start_run(run: Path, tmp_path: Path, *extra: str, preexec_fn=None) -> tuple[subprocess.Popen, Path]:
    err = tmp_path / f"{run.name}.stderr"
    cmd = [sys.executable, "-m", "polar.cli.main", "run", "--config", str(CARTPOLE), "--run-dir", str(run),
           "--no-progress", *FOREVER, *extra]
    with open(err, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, preexec_fn=preexec_fn)
    return proc, err


def set_total_steps(run: Path, steps: int) -> None:
    """What a user had to do before `polar resume -o`: edit the resolved config by hand."""
    path = run / "config.resolved.yaml"
    data = yaml.safe_load(path.read_text())
    data["total_env_steps"] = steps
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def tensorboard_steps(run: Path, tag: str) -> list[int]:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(run / "tb"))  # applies purges as TensorBoard's UI does
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_resume_after_sigkill_logs_no_iteration_twice(tmp_path):
    run = tmp_path / "killed"
    proc, err = start_run(run, tmp_path, "-o", "logging.checkpoint_freq=10")
    try:
        # a checkpoint, then rows past it: what a run that dies between checkpoints leaves behind
        wait_for(lambda: checkpoint_iterations(run) and rows_of(run)
                 and rows_of(run)[-1]["iteration"] >= checkpoint_iterations(run)[-1] + 2,
                 proc, err, 300, "a checkpoint and two metrics rows after it")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = rows_of(run)
    ckpt = checkpoint_iterations(run)[-1]
    assert before[-1]["iteration"] > ckpt  # rows the resumed run will log again
    set_total_steps(run, (before[-1]["iteration"] + 3) * STEPS_PER_ITER)

    p = polar("resume", run, "--no-progress")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = rows_of(run)
    iterations = [r["iteration"] for r in rows]
    assert iterations == list(range(1, before[-1]["iteration"] + 4)), iterations  # each once, in order
    assert [r["env_steps"] for r in rows] == [i * STEPS_PER_ITER for i in iterations]
    assert rows[:ckpt] == before[:ckpt]  # rows up to the checkpoint are the original ones
    steps = tensorboard_steps(run, "iteration")
    assert steps == sorted(set(steps)) and steps[-1] == rows[-1]["env_steps"], steps


def test_resume_skips_a_corrupt_newest_checkpoint_and_names_both(tmp_path):
    run = tmp_path / "corrupt"
    p = polar("run", "--config", CARTPOLE, "--run-dir", run, "--no-progress", *FOREVER,
              "-o", "total_env_steps=768", "-o", "logging.checkpoint_freq=1")
    assert p.returncode == 0, p.stderr[-3000:]
    newest = run / "checkpoints" / "ckpt_00000003.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # torn, as by a full disk
    set_total_steps(run, 1024)

    p = polar("resume", run, "--no-progress")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ckpt_00000003.pt is unreadable" in p.stderr
    assert "using checkpoint" in p.stderr and "ckpt_00000002.pt" in p.stderr
    assert "weights_only" not in p.stderr
    assert [r["iteration"] for r in rows_of(run)] == [1, 2, 3, 4]  # iteration 3 trained again, logged once


def _without_dac_override() -> None:  # pragma: no cover - runs in the child before exec
    """Root ignores permission bits through CAP_DAC_OVERRIDE; without it, a 0555 directory stops root too."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_CAPBSET_DROP, CAP_DAC_OVERRIDE = 24, 1
    if libc.prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0:
        os._exit(97)


def _read_only_preexec(tmp_path: Path):
    """A preexec under which a 0555 directory refuses writes: none for a normal user; for root, one that drops
    CAP_DAC_OVERRIDE. Probed first on a real directory; skips where neither works."""
    preexec = _without_dac_override if os.geteuid() == 0 else None
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    probe_dir.chmod(0o555)
    try:
        probe = subprocess.run([sys.executable, "-c", "import sys; open(sys.argv[1], 'w')", str(probe_dir / "x")],
                               preexec_fn=preexec, capture_output=True, text=True)
    finally:
        probe_dir.chmod(0o755)
    if probe.returncode == 0 or "PermissionError" not in probe.stderr:
        pytest.skip("a read-only directory does not stop this user's writes here (root keeps CAP_DAC_OVERRIDE)")
    return preexec


def _assert_one_line_error(stderr: str, path_part: str, cause: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-3000:]
    assert path_part in errors[0] and cause in errors[0], errors[0]


def _assert_earlier_checkpoints_intact(run: Path, iterations: list[int]) -> None:
    assert iterations and set(iterations) <= set(checkpoint_iterations(run))
    for i in iterations:
        assert load_checkpoint(run / "checkpoints" / f"ckpt_{i:08d}.pt")["iteration"] == i
    # a temp file begun just before the directory went read-only cannot be removed until it is writable
    # again; the next start of the run's checkpoints removes it
    CheckpointManager(run / "checkpoints")
    assert not [p for p in run.rglob("*") if ".tmp" in p.name]


def test_read_only_run_dir_gives_one_line(tmp_path):
    run = tmp_path / "ro"
    proc, err = start_run(run, tmp_path, "-o", "logging.checkpoint_freq=2", preexec_fn=_read_only_preexec(tmp_path))
    try:
        wait_for(lambda: (run / "checkpoints" / "LATEST").exists(), proc, err, 300, "the first checkpoint")
        before = checkpoint_iterations(run)
        for d in (run / "checkpoints", run):
            d.chmod(0o555)
        rc = proc.wait(timeout=300)
    finally:
        for d in (run, run / "checkpoints"):
            d.chmod(0o755)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = err.read_text()
    assert rc == 1, stderr[-3000:]
    _assert_one_line_error(stderr, str(run), "Permission denied (EACCES)")
    _assert_earlier_checkpoints_intact(run, before)


def test_a_write_that_fails_mid_file_gives_one_line_and_no_temp_file(tmp_path):
    """A full disk, simulated with RLIMIT_FSIZE (it binds root too): the checkpoint's write fails part-way with
    EFBIG where a full disk gives ENOSPC, through the same code path, and leaves a partial temp file."""
    run = tmp_path / "full"
    # 256x256 trunks: a checkpoint (weights + Adam moments, ~1.6 MB) is far over the 512 KiB limit set below,
    # while metrics.jsonl, run.json and the TensorBoard file stay far under it
    proc, err = start_run(run, tmp_path, "-o", "logging.checkpoint_freq=2", "-o", "agent.hidden_sizes=[256,256]")
    try:
        wait_for(lambda: (run / "checkpoints" / "LATEST").exists(), proc, err, 300, "the first checkpoint")
        before = checkpoint_iterations(run)
        limit = 512 * 1024
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = err.read_text()
    assert rc == 1, stderr[-3000:]
    _assert_one_line_error(stderr, str(run / "checkpoints" / "ckpt_"), "File too large (EFBIG)")
    _assert_earlier_checkpoints_intact(run, before)


def test_resume_with_an_override_trains_longer_and_keeps_it(tmp_path):
    run = tmp_path / "longer"
    p = polar("run", "--config", CARTPOLE, "--run-dir", run, "--no-progress", *FOREVER, "-o", "total_env_steps=512")
    assert p.returncode == 0, p.stderr[-3000:]
    resolved = (run / "config.resolved.yaml").read_text()

    for bad, words in ((["-o", "total_env_steps=many"], "total_env_steps"), (["-o", "total_env_step=2"], "did you mean")):
        p = polar("resume", run, "--no-progress", *bad)
        assert p.returncode == 1 and words in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
        assert (run / "config.resolved.yaml").read_text() == resolved  # a rejected override changes nothing

    p = polar("resume", run, "--no-progress", "-o", "total_env_steps=1024")
    assert p.returncode == 0, p.stderr[-3000:]
    assert [r["iteration"] for r in rows_of(run)] == [1, 2, 3, 4]
    assert yaml.safe_load((run / "config.resolved.yaml").read_text())["total_env_steps"] == 1024
