"""A connector written as the seed document writes it trains, has distinct copies, survives its crashes.

``connectors/seed_shaped.py`` is that connector: a plain class, randomness only from ``config["seed"]``,
``reset()`` without a seed, a 4-tuple ``step()``, and a process crash decided by its seeded RNG.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from polar.cli.main import main as polar_main
from polar.harness.connector.vector_env import RESTART_KEY, ConnectorVectorEnv

from .conftest import CONNECTORS_DIR, make_spec

ROOT = Path(__file__).resolve().parents[2]


def documented_seed(config_seed: int, run_seed: int, worker_index: int, vector_index: int, restarts: int) -> int:
    """The rule in docs/connector-protocol.md ("Copies and seeds"), recomputed here from numpy alone."""
    parts = [config_seed, run_seed, worker_index, vector_index, restarts]
    return int(np.random.SeedSequence([p % 2**64 for p in parts]).generate_state(1)[0])


def read_log(log_dir: Path) -> list[dict]:
    rows = []
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text().splitlines():
            what, seed, w, v, r, episode, steps, cell = line.split()
            rows.append({"what": what, "seed": int(seed), "worker": w, "vector": v, "restarts": r,
                         "episode": int(episode), "steps": int(steps), "cell": int(cell)})
    return rows


def starts_by_copy(rows: list[dict]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        if row["what"] == "start" and row["restarts"] == "0":
            out[row["vector"]].append(row["cell"])
    return out


def seed_spec(log_dir: Path, **config):
    return make_spec("MyGameConnector", module="seed_shaped", config={"seed": 42, "log": str(log_dir), **config})


def walk(envs, steps: int) -> None:
    rng = np.random.default_rng(0)
    for _ in range(steps):
        envs.step(rng.integers(0, 2, envs.num_envs))


@pytest.mark.parametrize("copies_per_process", [None, 2])
def test_copies_get_their_own_indices_and_seeds_and_play_distinct_episodes(tmp_path, copies_per_process):
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    spec = seed_spec(log_dir).model_copy(update={"copies_per_process": copies_per_process})
    envs = ConnectorVectorEnv(spec, 4, seed=7, config_dir=CONNECTORS_DIR, worker_index=3)
    try:
        obs, _ = envs.reset()
        walk(envs, 60)
    finally:
        envs.close()
    rows = read_log(log_dir)
    seeds = {row["vector"]: row["seed"] for row in rows}
    assert sorted(seeds) == ["0", "1", "2", "3"]  # vector indices run on across processes
    assert {row["worker"] for row in rows} == {"3"} and {row["restarts"] for row in rows} == {"0"}
    for v, seed in seeds.items():
        assert seed == documented_seed(42, 7, 3, int(v), 0)
    starts = starts_by_copy(rows)
    assert len({tuple(s[:4]) for s in starts.values()}) == 4, starts  # four different games, not one played four times
    assert len({int(np.argmax(o)) for o in obs["visual"]}) > 1  # and different first observations


def test_same_run_seed_replays_the_same_copies_and_another_one_does_not(tmp_path):
    def starts(run_seed: int, name: str) -> dict:
        log_dir = tmp_path / name
        log_dir.mkdir()
        envs = ConnectorVectorEnv(seed_spec(log_dir), 3, seed=run_seed, config_dir=CONNECTORS_DIR)
        try:
            envs.reset()
            walk(envs, 60)
        finally:
            envs.close()
        return starts_by_copy(read_log(log_dir))

    first = starts(0, "a")
    assert starts(0, "b") == first
    assert starts(1, "c") != first


def test_a_restarted_copy_gets_a_fresh_seed_and_does_not_replay_its_crash(tmp_path):
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    # crashes about once per 25 steps; with the same seed again it would crash at the very same step,
    # every time, and give up after max_restarts=2
    envs = ConnectorVectorEnv(seed_spec(log_dir, crash_prob=0.04).model_copy(update={"max_restarts": 2}), 1, seed=0,
                              config_dir=CONNECTORS_DIR)
    restarts_seen = 0
    try:
        envs.reset()
        for _ in range(400):  # ~16 crashes expected; bounded
            *_, trunc, info = envs.step(np.ones(1, dtype=np.int64))
            if trunc[0] and info.get(RESTART_KEY, [False])[0]:
                restarts_seen += 1
            if restarts_seen >= 4:
                break
    finally:
        envs.close()
    assert restarts_seen >= 4 and envs.restarts == restarts_seen
    rows = read_log(log_dir)
    crashes = [row for row in rows if row["what"] == "crash"]
    assert [row["restarts"] for row in crashes[:4]] == ["0", "1", "2", "3"]
    assert [row["seed"] for row in crashes[:4]] == [documented_seed(42, 0, 0, 0, r) for r in range(4)]
    assert len({row["seed"] for row in crashes}) == len(crashes)  # every incarnation plays a game of its own
    assert len({row["steps"] for row in crashes[:4]}) > 1  # so the crash does not come back at the same step


def test_polar_check_passes_with_a_seeding_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(CONNECTORS_DIR)
    assert polar_main(["check", "seed_shaped:MyGameConnector", "-o", "harness.connector_spec.config.seed=42",
                       "--steps", "80"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "conforms" in out
    assert "MyGameConnector.reset() takes no seed, so reset(seed=s) cannot replay an episode" in out
    assert "connector_spec.config.seed" in out and "def reset(self, seed=None)" in out


def test_polar_check_fails_a_broken_step_naming_step_with_its_traceback(capsys, monkeypatch):
    monkeypatch.chdir(CONNECTORS_DIR)
    assert polar_main(["check", "seed_shaped:BrokenStepConnector", "-o", "harness.connector_spec.config.seed=42",
                       "--steps", "20"]) == 1
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "BrokenStepConnector.step raised AttributeError" in flat and "reward_for" in flat
    assert "connector output:" in out
    assert "return self._obs(), self.reward_for[action], False, {}" in out  # the connector's own traceback line


RUN_CONFIG = """\
name: seed_shaped_crashy
seed: 0
harness:
  type: custom
  connector_spec:
    module: seed_shaped
    class_name: MyGameConnector
    config:
      seed: 41
      crash_prob: {crash_prob}
      log: {log}
    restart_backoff_s: 0.05
agent:
  type: mlp
  hidden_sizes: [32, 32]
policy:
  type: ppo
  kwargs:
    n_steps: 64
    batch_size: 128
    n_epochs: 2
distribution:
  backend: local
  rollout_workers: 0
  envs_per_worker: 4
total_env_steps: 2048
logging:
  checkpoint_freq: 100
eval:
  at_end: false
"""


def test_crashing_seed_shaped_connector_trains_to_the_end(tmp_path):
    """Each copy crashes once every ~300 steps, the process (4 copies) once every ~75: the run must end well.

    Seed 41's game crashes at its step 21: a copy that got seed 41 again after each restart would crash at
    step 21 again, every time."""
    shutil.copy(CONNECTORS_DIR / "seed_shaped.py", tmp_path / "seed_shaped.py")
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    config = tmp_path / "crashy.yaml"
    config.write_text(RUN_CONFIG.format(crash_prob=1 / 300, log=log_dir))
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(config), "--run-dir", str(run),
                        "--no-progress"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] >= 2048
    process_restarts = rows[-1]["connector/process_restarts"]
    assert process_restarts >= 3  # it did crash, several times
    assert rows[-1]["connector/copies_restarted"] == 4 * process_restarts  # all 4 copies live in the one process
    assert "connector_restarts" not in rows[-1]
    log = read_log(log_dir)
    crashes = [row for row in log if row["what"] == "crash"]
    assert len(crashes) == process_restarts
    assert len({(row["seed"], row["steps"]) for row in crashes}) == len(crashes)  # no crash replayed
