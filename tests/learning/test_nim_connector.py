"""Does polar train a 2-player game written in JavaScript through the multi-agent connector protocol? The shipped
example (examples/node_connector/nim_selfplay.yaml, self-play PPO), then polar eval's 500 games against a uniformly
random legal player, the learner's seat alternating: at least 90% won (random against random: 50%; the optimal
player against random: 98%; /work/notes/marl-benchmarks.md, "Nim in JavaScript")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_self_play_through_the_connector_wins_90_percent_of_500_games_of_javascript_nim_against_random(tmp_path):
    from polar.config import load_config
    from polar.trainers.build import build_trainer, evaluate_run
    from polar.trainers.run_dir import RunDir

    cfg = load_config(ROOT / "examples" / "node_connector" / "nim_selfplay.yaml",
                      overrides=["logging.progress_bar=false"])
    run = RunDir.create(cfg.name, tmp_path / "run", config_dir=cfg.config_dir)
    build_trainer(cfg, run).train()
    _, _, res = evaluate_run(run.path, episodes=500)
    vs_random = res["vs_random"]
    assert vs_random["games"] == 500
    assert vs_random["learner"]["win_rate"] >= 0.90, vs_random
