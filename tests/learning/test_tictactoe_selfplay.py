"""Does self-play PPO learn TicTacToe? The shipped example, then 500 games against a uniformly random legal player
(the learner's seat alternating): at least 95% won or drawn (issue 36, "Done when: TicTacToe"). Not met yet:
94.8%, 93.8% and 93.6% (seeds 0-2; at 400k env steps 95.6%, 94.6%, 94.0%); the points missing are player_2's
(docs/benchmarks.md, TicTacToe self-play), so this slow test fails until it is."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_tictactoe_self_play_wins_or_draws_95_percent_of_500_games_against_random(tmp_path):
    from polar.config import load_config
    from polar.trainers.build import build_trainer, evaluate_run
    from polar.trainers.run_dir import RunDir

    cfg = load_config(ROOT / "examples" / "tictactoe_selfplay.yaml")
    run = RunDir.create(cfg.name, tmp_path / "run")
    build_trainer(cfg, run).train()
    _, _, res = evaluate_run(run.path, episodes=500)
    vs_random = res["vs_random"]
    assert vs_random["games"] == 500
    assert vs_random["learner"]["win_or_draw_rate"] >= 0.95, vs_random
