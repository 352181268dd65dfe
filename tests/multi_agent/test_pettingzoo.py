"""PettingZoo harnesses, policy mapping and self-play (issue 36, point 1; TicTacToe's "an illegal move is never
played"). Every run here is in-process and small: a few thousand env steps."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from polar.config.base import validate
from polar.config.multi_agent import SelfPlayConfig
from polar.config.run import RunConfig
from polar.errors import ConfigError, HarnessError
from polar.rollout.self_play import OpponentPool
from tests.multi_agent import envs

TTT = "pettingzoo.classic.tictactoe_v3"
COOP = "tests.multi_agent.envs:coop"


def _cfg(harness: dict, steps: int = 2000, kwargs: dict | None = None, **extra) -> RunConfig:
    return validate(RunConfig, {
        "harness": {"type": "pettingzoo", **harness},
        "policy": {"type": "ppo", "kwargs": {"n_steps": 32, "batch_size": 128, "n_epochs": 2, **(kwargs or {})}},
        "distribution": {"envs_per_worker": 4}, "total_env_steps": steps,
        "logging": {"tensorboard": False, "checkpoint_freq": 0, "progress_bar": False},
        "eval": {"at_end": True, "episodes": 10}, **extra})


def _train(cfg, tmp_path, name: str = "run"):
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir

    rows: list[dict] = []
    trainer = build_trainer(cfg, RunDir.create(name, tmp_path / name), on_iteration=rows.append)
    return trainer, trainer.train(), rows


def test_tictactoe_self_play_never_plays_an_illegal_move(tmp_path):
    envs.PLAYED.clear()
    cfg = _cfg({"id": "tests.multi_agent.envs:counting_tictactoe",
                "self_play": {"snapshot_every_n_iterations": 1, "eval_games": 40}},
               steps=3000, eval={"every_n_iterations": 2, "at_end": True})
    _, res, _ = _train(cfg, tmp_path)
    assert len(envs.PLAYED) > 3000  # training moves, then evaluation's against random and the pool
    assert {agent for agent, _, _ in envs.PLAYED} == {"player_1", "player_2"}
    illegal = [m for m in envs.PLAYED if not m[2]]
    assert illegal == []
    assert res["eval"]["vs_random"]["games"] == 40


def test_a_policy_mapping_that_leaves_an_agent_without_a_policy_is_an_error_naming_it(tmp_path):
    cfg = _cfg({"id": TTT, "policy_mapping": {"player_1": "x"}})
    with pytest.raises(ConfigError, match=r"agent 'player_2' of pettingzoo env .*tictactoe_v3 has no policy"):
        _train(cfg, tmp_path)


def test_agents_that_share_a_policy_with_different_spaces_are_an_error_naming_both(tmp_path):
    cfg = _cfg({"id": COOP, "env_kwargs": {"mismatched": True}})
    with pytest.raises(ConfigError, match=r"agents 'a' and 'b' share policy 'shared' but their observation spaces differ"):
        _train(cfg, tmp_path)


def test_an_undeclared_agent_appearing_mid_episode_is_refused_naming_it_and_the_step(tmp_path):
    cfg = _cfg({"id": COOP, "env_kwargs": {"ghost_at": 3}})
    with pytest.raises(HarnessError, match=r"agent 'ghost' appeared at step 3 of episode 1"):
        _train(cfg, tmp_path)


def test_a_declared_agent_joining_mid_episode_is_played_from_its_first_step(tmp_path):
    cfg = _cfg({"id": COOP, "env_kwargs": {"late_joiner": True}}, steps=600)
    _trainer, res, _ = _train(cfg, tmp_path)
    assert res["env_steps"] >= 600


def test_agents_that_share_a_policy_act_in_one_batched_forward_per_step():
    from polar.models.policy import build_policy
    from polar.rollout.backends.multi_agent import MultiAgentCollector, policy_spaces, resolve_mapping

    cfg = _cfg({"id": COOP})
    mapping = resolve_mapping(cfg.harness, ["a", "b"])
    obs_space, act_space = policy_spaces(cfg.harness, mapping, {a: (envs.Coop().observation_space(a),
                                                                    envs.Coop().action_space(a)) for a in "ab"})["shared"]
    policy = build_policy(cfg, obs_space, act_space)
    sizes: list[int] = []
    act = policy.act
    policy.act = lambda obs, state=None, deterministic=False: (sizes.append(obs.shape[0]), act(obs, state, deterministic))[1]
    collector = MultiAgentCollector(cfg.harness, {"shared": policy}, mapping, fragment_steps=16, num_envs=4, seed=0)
    batch = collector.collect()
    second = collector.collect()
    collector.close()
    frag = batch.data["shared"]
    assert frag.rewards.shape == (16, 8)  # 4 env copies x 2 agents, one column each
    assert set(sizes[:16]) == {8}  # every step: the 8 agents in one forward (the truncation values are their own)
    # a decision's outcome arrives with the next poll: the first batch takes one step more, then 16 per copy each;
    # each stream (one agent of one copy) is one column here
    assert (batch.env_steps, second.env_steps) == (17 * 4, 16 * 4)
    # each 8-step episode is truncated at its 8th decision, bootstrapped from V(final observation)
    assert frag.truncated[7].all() and frag.truncated[15].all() and not frag.truncated[:7].any()
    assert (frag.trunc_values[7] != 0).all()


def test_aec_rewards_go_to_the_decision_that_earned_them(tmp_path):
    """TicTacToe: a won game pays +1 to the winner's last move and -1 to the loser's, both terminal."""
    from polar.models.policy import build_policy
    from polar.rollout.backends.multi_agent import MultiAgentCollector, resolve_mapping

    cfg = _cfg({"id": TTT})
    from polar.harness.pettingzoo_env import agent_spaces, make_pettingzoo_env

    spaces = agent_spaces(make_pettingzoo_env(cfg.harness))
    policy = build_policy(cfg, *spaces["player_1"])
    collector = MultiAgentCollector(cfg.harness, {"shared": policy}, resolve_mapping(cfg.harness, list(spaces)), 32, 4, 0)
    frag = collector.collect().data["shared"]
    collector.close()
    ended = frag.terminated.astype(bool)
    assert ended.any()
    assert (frag.rewards[~ended] == 0).all()  # no reward before the game ends
    assert set(np.unique(frag.rewards[ended])) <= {-1.0, 0.0, 1.0}
    # self-play without a pool: every decided game pays one +1 and one -1; at most a tick's worth (4 decisions)
    # of one side's endings wait for the next batch
    assert abs(int((frag.rewards == 1).sum()) - int((frag.rewards == -1).sum())) <= 4


def test_one_policy_per_agent_trains_two_policies_and_checkpoints_both(tmp_path):
    cfg = _cfg({"id": TTT, "policy_mapping": {"player_1": "x", "player_2": "o"}}, steps=1000)
    trainer, res, rows = _train(cfg, tmp_path)
    assert set(trainer.learner.policies) == {"x", "o"}
    assert "x/pg_loss" in rows[-1] and "o/pg_loss" in rows[-1]
    from polar.trainers.checkpoint import CheckpointManager, load_checkpoint

    state = load_checkpoint(CheckpointManager(trainer.run_dir.checkpoints_dir).latest())
    assert set(state["policies"]) == {"x", "o"}
    assert not all(torch.equal(state["policies"]["x"][k], state["policies"]["o"][k]) for k in state["policies"]["x"])
    assert set(res["eval"]["per_agent"]["return_mean"]) == {"player_1", "player_2"}


def test_self_play_snapshots_join_the_pool_on_schedule_and_every_evaluation_logs_win_rates(tmp_path):
    cfg = _cfg({"id": TTT, "self_play": {"pool_size": 3, "snapshot_every_n_iterations": 2, "eval_games": 12}},
               steps=2500, eval={"every_n_iterations": 2, "at_end": True})
    trainer, res, rows = _train(cfg, tmp_path)
    assert len(rows) >= 6  # ~390 env steps an iteration
    for r in rows:
        assert r["self_play/pool_size"] == min(3, r["iteration"] // 2)
        if r["iteration"] % 2 == 0:
            assert 0.0 <= r["eval/vs_random/win_rate"] <= 1.0 and 0.0 <= r["eval/vs_pool/win_rate"] <= 1.0
        else:
            assert "eval/vs_random/win_rate" not in r
    final = json.loads((trainer.run_dir.path / "eval" / "final.json").read_text())
    assert final["vs_random"]["games"] == 12 and final["vs_pool"]["games"] == 12
    assert "vs_pool" in res["eval"]


def test_self_play_latest_share_one_plays_only_the_current_policy(tmp_path):
    cfg = _cfg({"id": TTT, "self_play": {"snapshot_every_n_iterations": 1, "latest_share": 1.0}}, steps=1500)
    _, _, rows = _train(cfg, tmp_path)
    assert rows[-1]["self_play/pool_size"] > 0
    assert all(r["self_play/train_games"] == 0 for r in rows)  # no game against a pool snapshot


def _pool(sampling: str) -> OpponentPool:
    pool = OpponentPool(SelfPlayConfig(sampling=sampling, latest_share=0.0, pool_size=2),
                        lambda: torch.nn.Linear(1, 1), seed=0)
    strong, weak = pool.add(torch.nn.Linear(1, 1).state_dict(), 1), pool.add(torch.nn.Linear(1, 1).state_dict(), 2)
    for _ in range(18):
        pool.record(strong.snapshot_id, "loss")  # the learner loses to the strong one
        pool.record(weak.snapshot_id, "win")
    return pool


def test_opponent_pool_samples_uniformly_or_by_the_opponents_win_rate():
    np.testing.assert_allclose(_pool("uniform").weights(), [0.5, 0.5])
    np.testing.assert_allclose(_pool("win_rate").weights(), [0.95, 0.05])  # (18 + 1) / 20 vs (0 + 1) / 20
    pool = _pool("win_rate")
    draws = [pool.sample().snapshot_id for _ in range(400)]
    assert 0.9 < draws.count(0) / 400
    pool.add(torch.nn.Linear(1, 1).state_dict(), 3)
    assert [s.iteration for s in pool.snapshots] == [2, 3]  # pool_size 2: the oldest left


def test_polar_eval_reports_per_agent_returns_and_win_draw_loss(tmp_path):
    from polar.trainers.build import evaluate_run

    cfg = _cfg({"id": TTT, "self_play": {"snapshot_every_n_iterations": 1}}, steps=600)
    trainer, _, _ = _train(cfg, tmp_path)
    _, _, res = evaluate_run(trainer.run_dir.path, episodes=10)
    assert set(res["per_agent"]["return_mean"]) == {"player_1", "player_2"}
    for agent in ("player_1", "player_2"):
        r = res["per_agent"][agent]
        assert r["win"] + r["draw"] + r["loss"] == 10
    assert res["vs_random"]["games"] == 10 and res["vs_pool"]["games"] == 10
    assert (trainer.run_dir.path / "eval").glob("eval_*.json")


def test_env_kwargs_reach_the_env(tmp_path):
    from polar.rollout.backends.multi_agent import Seat, play_games

    cfg = _cfg({"id": COOP, "env_kwargs": {"length": 5}})
    rep = play_games(cfg.harness, lambda g: {"a": Seat("random"), "b": Seat("random")}, {}, {"a": "shared", "b": "shared"},
                     3, seed=0)
    assert rep.games == 3 and all(len(r) == 3 for r in rep.returns.values())
    trainer, _res, _ = _train(cfg, tmp_path, "len5")
    assert trainer.window.summary()["episode_len_mean"] == 5


@pytest.mark.parametrize(("change", "message"), [
    ({"policy": {"type": "dqn"}}, "harness.type pettingzoo trains with ppo"),
    ({"distribution": {"rollout_workers": 2}}, "set backend: local and rollout_workers: 0"),
    ({"agent": {"type": "lstm"}}, "feed-forward agents"),
])
def test_what_a_pettingzoo_run_cannot_do_is_refused_at_start(tmp_path, change, message):
    data = {"harness": {"type": "pettingzoo", "id": TTT}, "policy": {"type": "ppo"}, **change}
    cfg = validate(RunConfig, data)
    with pytest.raises(ConfigError, match=message):
        _train(cfg, tmp_path)


def test_a_run_folder_naming_an_env_module_of_its_own_needs_trust_code_to_reopen():
    from polar.config.trust import require_trust

    require_trust(_cfg({"id": TTT}), "run R", trust_code=False)  # PettingZoo's own module: installed code
    for env_id in (COOP, "my_envs", "pettingzoo.classic.tictactoe_v3:env"):
        with pytest.raises(ConfigError, match=rf"run R names code that would run here: harness.id = '{env_id}'"):
            require_trust(_cfg({"id": env_id}), "run R", trust_code=False)
        require_trust(_cfg({"id": env_id}), "run R", trust_code=True)


def test_polar_export_writes_one_servable_export_per_policy_of_a_multi_agent_run(tmp_path):
    from polar.deploy.export import export_run
    from tests.deploy.serving import LiveServer

    cfg = _cfg({"id": TTT, "policy_mapping": {"player_1": "x", "player_2": "o"}}, steps=600, eval={"at_end": False})
    trainer, _, _ = _train(cfg, tmp_path)
    out = tmp_path / "export"
    m = export_run(trainer.run_dir.path, out, samples=64)
    assert set(m["policies"]) == {"x", "o"}
    assert sorted(p.name for p in out.iterdir()) == ["o", "x"]
    board = np.zeros((3, 3, 2), np.int8)
    board[0, 0, 1] = 1  # the opponent took the corner
    mask = np.ones(9, np.int8)
    mask[0] = 0
    obs = {"observation": torch.as_tensor(board[None]), "action_mask": torch.as_tensor(mask[None])}
    for pid, agent in (("x", "player_1"), ("o", "player_2")):
        man = json.loads((out / pid / "manifest.json").read_text())
        assert man["policy_id"] == pid and man["agents"] == [agent] and man["parity"]["samples"] == 64
        want = int(trainer.learner.policies[pid].act(obs, None, True)[0].reshape(-1)[0])
        with LiveServer(out / pid, poll_s=0) as s:
            got = s.client.post("/v1/act", json={"observation": {"observation": board.tolist(),
                                                                 "action_mask": mask.tolist()}}).json()
        assert got["action"] == want and got["action"] != 0  # the policy's own move, and a legal one
    export_run(trainer.run_dir.path, out, samples=16)  # a second export replaces the first
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(envs.ROOT), "COLUMNS": "200"}
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "export", str(trainer.run_dir.path), "--out",
                        str(tmp_path / "cli"), "--samples", "16"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    for pid in ("x", "o"):
        assert f"to {tmp_path / 'cli' / pid}" in " ".join((p.stdout + p.stderr).split()), p.stderr


@pytest.mark.parametrize(("self_play", "key"), [({"sampling": "elo"}, "sampling"), ({"latest_share": 1.5}, "latest_share"),
                                                 ({"pool_size": 0}, "pool_size"), ({"poolsize": 3}, "poolsize"),
                                                 ({"opponent_noise": 1.5}, "opponent_noise"),
                                                 ({"seat_sampling": "elo"}, "seat_sampling")])
def test_bad_self_play_settings_are_refused_naming_the_key(self_play, key):
    with pytest.raises(ConfigError, match=rf"harness\.self_play\.{key}"):
        _cfg({"id": TTT, "self_play": self_play})


def test_a_seat_that_sits_out_games_never_makes_the_batch_wait_or_go_stale():
    """Self-play against the pool leaves one seat of each game untrained; the batch packs the streams it has, so
    every decision of a batch was taken by the weights of that batch's version."""
    from polar.harness.pettingzoo_env import agent_spaces, make_pettingzoo_env
    from polar.models.policy import build_policy
    from polar.rollout.backends.multi_agent import MultiAgentCollector, resolve_mapping

    cfg = _cfg({"id": TTT, "self_play": {"latest_share": 0.0}})
    spaces = agent_spaces(make_pettingzoo_env(cfg.harness))
    policy = build_policy(cfg, *spaces["player_1"])
    pool = OpponentPool(cfg.harness.self_play, lambda: build_policy(cfg, *spaces["player_1"]), seed=0)
    pool.add(policy.state_dict(), 0)
    collector = MultiAgentCollector(cfg.harness, {"shared": policy}, resolve_mapping(cfg.harness, list(spaces)), 32, 4,
                                    0, pool)
    for version in range(1, 30):
        frag = collector.collect().data["shared"]
        collector.publish({}, version)
        assert frag.rewards.shape == (32, 8)
        # what waits for the next batch: under one tick (one decision per env copy)
        assert sum(len(q) for q in collector.done.values()) < 4
    collector.close()


def test_a_self_play_run_resumes_with_its_pool_and_counters(tmp_path):
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir

    sp = {"snapshot_every_n_iterations": 1, "pool_size": 4, "sampling": "win_rate"}
    first, _, _ = _train(_cfg({"id": TTT, "self_play": sp}, steps=800, eval={"at_end": False}), tmp_path)
    pool = [(s.snapshot_id, s.wins, s.losses) for s in first.learner.pool.snapshots]
    assert len(pool) >= 2 and any(w or lo for _, w, lo in pool)  # snapshots with scores
    cfg = _cfg({"id": TTT, "self_play": sp}, steps=1600, eval={"at_end": False})
    again = build_trainer(cfg, RunDir.open(first.run_dir.path), resume=True)
    again.restore()
    try:
        assert again.env_steps == first.env_steps and again.iteration == first.iteration
        assert [(s.snapshot_id, s.wins, s.losses) for s in again.learner.pool.snapshots] == pool
        for k, v in first.learner.policies["shared"].state_dict().items():
            assert torch.equal(again.learner.policies["shared"].state_dict()[k], v)
    finally:
        again.collector.close()


def test_the_polar_eval_command_prints_per_agent_returns_and_win_draw_loss(tmp_path):
    import os
    import subprocess
    import sys

    trainer, _, _ = _train(_cfg({"id": TTT, "self_play": {"snapshot_every_n_iterations": 1}}, steps=600,
                                eval={"at_end": False}), tmp_path)
    env = {**os.environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[2]), "COLUMNS": "200"}
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "eval", str(trainer.run_dir.path), "--episodes", "6"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    for text in ("(6 games)", "player_1", "player_2", "learner vs random", "learner vs pool", "win", "draw", "loss"):
        assert text in p.stdout + p.stderr, text


def test_self_play_random_share_seats_a_random_player_in_that_share_of_training_games(tmp_path):
    envs.PLAYED.clear()
    cfg = _cfg({"id": "tests.multi_agent.envs:counting_tictactoe", "self_play": {"random_share": 1.0}}, steps=800,
               eval={"at_end": False})
    _, _, rows = _train(cfg, tmp_path, "all_random")
    assert all(r["self_play/train_games_vs_random"] > 0 for r in rows)
    assert all(m[2] for m in envs.PLAYED)  # the random player's moves are legal too
    cfg = _cfg({"id": TTT, "self_play": {"random_share": 0.0}}, steps=800, eval={"at_end": False})
    _, _, rows = _train(cfg, tmp_path, "none")
    assert all(r["self_play/train_games_vs_random"] == 0 for r in rows)


def test_a_parallel_env_that_observes_only_the_mover_pays_a_waiting_agent_when_it_acts_again_or_ends(tmp_path):
    """Turn-based over the Parallel API (what the multi-agent connector protocol allows): "b" waits while "a"
    moves; its rewards meanwhile add up on its last decision, and the last mover's win or loss reaches "b"'s."""
    from polar.harness.pettingzoo_env import agent_spaces, make_pettingzoo_env
    from polar.models.policy import build_policy
    from polar.rollout.backends.multi_agent import MultiAgentCollector

    cfg = _cfg({"id": "tests.multi_agent.envs:turn_taking", "env_kwargs": {"moves": 3}})
    spaces = agent_spaces(make_pettingzoo_env(cfg.harness))
    policy = build_policy(cfg, *spaces["a"])
    collector = MultiAgentCollector(cfg.harness, {"a": policy, "b": policy}, {"a": "a", "b": "b"}, 8, 2, 0)
    try:
        data = collector.collect().data
    finally:
        collector.close()
    a, b = data["a"], data["b"]
    # "a" moves at t=0 and t=2: its first move earns 0.1 then waits (0.01 while "b" moves): 0.11; its last decides
    assert np.allclose(a.rewards[~a.terminated.astype(bool)], 0.11)
    assert set(np.unique(a.rewards[a.terminated.astype(bool)])) <= {-1.0, 1.0}
    # "b"'s one move earns 0.1, then the game ends on "a"'s move: its return is 0.1 -/+ 1, and it is terminal
    assert b.terminated.all()
    assert np.allclose(np.abs(b.rewards - 0.1), 1.0)


def test_the_cooperative_example_runs_with_one_shared_policy_for_its_three_agents(tmp_path):
    """The fast path of tests/learning/test_simple_spread.py: examples/simple_spread.yaml (MPE2, Parallel API)."""
    from polar.config import load_config

    cfg = load_config(envs.ROOT / "examples" / "simple_spread.yaml",
                      overrides=["total_env_steps=400", "eval.episodes=3", "logging.progress_bar=false",
                                 "logging.checkpoint_freq=0"])
    trainer, res, rows = _train(cfg, tmp_path)
    assert set(trainer.learner.policies) == {"shared"}
    assert set(res["eval"]["per_agent"]["return_mean"]) == {"agent_0", "agent_1", "agent_2"}
    assert rows[-1]["env_steps"] >= 400 and np.isfinite(rows[-1]["pg_loss"])


def test_a_parallel_step_that_observes_no_live_agent_is_an_error_naming_the_step(tmp_path):
    from polar.rollout.backends.multi_agent import Seat, play_games

    cfg = _cfg({"id": "tests.multi_agent.envs:turn_taking", "env_kwargs": {"moves": 4, "silent_at": 2}})
    with pytest.raises(HarnessError, match=r"at step 2 of episode 1 no live agent \('a', 'b'\) is observed, so none "
                                           r"can act; a step must observe at least one live agent"):
        play_games(cfg.harness, lambda g: {"a": Seat("random"), "b": Seat("random")}, {}, {"a": "s", "b": "s"}, 1, 0)


def test_tictactoe_batches_carry_the_learning_signal_the_loss_needs(tmp_path):
    """The checks behind docs/benchmarks.md's TicTacToe reading: the masked log-probs the loss computes equal those
    stored when acting (the mask is in the loss), and every terminal decision's GAE return is its own reward
    (nothing bootstraps past an agent's episode end)."""
    from polar.algorithms.advantages import rollout_gae
    from polar.buffers.rollout_buffer import RolloutBuffer
    from polar.harness.pettingzoo_env import agent_spaces, make_pettingzoo_env
    from polar.models.policy import build_policy
    from polar.rollout.backends.multi_agent import MultiAgentCollector, resolve_mapping

    cfg = _cfg({"id": TTT})
    spaces = agent_spaces(make_pettingzoo_env(cfg.harness))
    policy = build_policy(cfg, *spaces["player_1"])
    collector = MultiAgentCollector(cfg.harness, {"shared": policy}, resolve_mapping(cfg.harness, list(spaces)), 32, 4, 0)
    try:
        frag = collector.collect().data["shared"]
    finally:
        collector.close()
    obs = {k: torch.as_tensor(v.reshape(-1, *v.shape[2:])) for k, v in frag.obs.items()}
    log_prob = policy.agent.evaluate_actions(obs, torch.as_tensor(frag.actions.reshape(-1)))[0]
    assert np.allclose(log_prob.detach().numpy().reshape(frag.log_probs.shape), frag.log_probs, atol=1e-6)
    _, returns = rollout_gae(RolloutBuffer([frag]), 0.99, 0.95)
    ended = frag.terminated.astype(bool)
    assert ended.sum() > 10
    assert np.allclose(returns.numpy()[ended], frag.rewards[ended], atol=1e-5)


def _greedy_collector(noise: float):
    """Learner and its one pool snapshot both play the lowest-numbered legal square (a pi_head bias of -20 per
    square), every game against the pool; so any other move is an opponent's random one."""
    from polar.harness.pettingzoo_env import agent_spaces, make_pettingzoo_env
    from polar.models.policy import build_policy
    from polar.rollout.backends.multi_agent import MultiAgentCollector, resolve_mapping

    cfg = _cfg({"id": "tests.multi_agent.envs:counting_tictactoe",
                "self_play": {"latest_share": 0.0, "random_share": 0.0, "opponent_noise": noise}})
    spaces = agent_spaces(make_pettingzoo_env(cfg.harness))
    policy = build_policy(cfg, *spaces["player_1"])
    with torch.no_grad():
        policy.agent.pi_head.weight.zero_()
        policy.agent.pi_head.bias.copy_(-20.0 * torch.arange(9.0))
    pool = OpponentPool(cfg.harness.self_play, lambda: build_policy(cfg, *spaces["player_1"]), seed=0)
    pool.add(policy.state_dict(), 0)
    return MultiAgentCollector(cfg.harness, {"shared": policy}, resolve_mapping(cfg.harness, list(spaces)), 32, 4, 0,
                               pool)


@pytest.mark.parametrize("noise", [0.0, 0.5, 1.0])
def test_self_play_opponent_noise_makes_a_pool_opponent_play_that_share_of_its_moves_at_random(noise):
    envs.PLAYED.clear()
    envs.LOWEST.clear()
    collector = _greedy_collector(noise)
    try:
        for _ in range(4):
            collector.collect()
        random_moves = collector.metrics()["self_play/opponent_random_moves"]
    finally:
        collector.close()
    moves = len(envs.LOWEST)
    other = moves - sum(envs.LOWEST)  # moves that were not the policies' own (lowest legal square)
    assert all(m[2] for m in envs.PLAYED)  # a random move is a legal one
    if noise == 0.0:
        assert other == 0 and random_moves == 0
    else:
        # about half the moves are the opponent's; a random one can still hit the lowest legal square
        share = random_moves / moves
        assert abs(share - noise / 2) < 0.1, (share, noise)
        assert other <= random_moves and other > 0.4 * random_moves


def _vs_random_collector(seat_sampling: str, seed: int = 0):
    """Every training game against a random player (random_share 1): the learner holds one seat of each."""
    from polar.harness.pettingzoo_env import agent_spaces, make_pettingzoo_env
    from polar.models.policy import build_policy
    from polar.rollout.backends.multi_agent import MultiAgentCollector, resolve_mapping

    cfg = _cfg({"id": TTT, "self_play": {"random_share": 1.0, "seat_sampling": seat_sampling}})
    spaces = agent_spaces(make_pettingzoo_env(cfg.harness))
    policy = build_policy(cfg, *spaces["player_1"])
    return MultiAgentCollector(cfg.harness, {"shared": policy}, resolve_mapping(cfg.harness, list(spaces)), 32, 4,
                               seed)


def test_self_play_seat_sampling_win_rate_seats_the_learner_more_often_where_it_does_worse():
    uniform = _vs_random_collector("uniform")
    prio = _vs_random_collector("win_rate")
    try:
        np.testing.assert_allclose(uniform.seat_weights(), [0.5, 0.5])
        np.testing.assert_allclose(prio.seat_weights(), [0.5, 0.5])  # no games yet: both seats alike
        # the learner won its last 100 games as player_1 and lost them as player_2
        prio.seat_results = {"player_1": {"win": 100.0, "draw": 0.0, "loss": 0.0},
                             "player_2": {"win": 0.0, "draw": 0.0, "loss": 100.0}}
        np.testing.assert_allclose(prio.seat_weights(), [1 / 102, 101 / 102])
        share = {}
        for name, c in (("uniform", uniform), ("win_rate", prio)):
            c.collect()
            m = c.metrics()
            games = m["self_play/learner_games/player_1"] + m["self_play/learner_games/player_2"]
            assert games > 30
            share[name] = m["self_play/learner_games/player_2"] / games
        assert 0.3 < share["uniform"] < 0.7 and share["win_rate"] > 0.85, share
        # the games just played were counted at their seat (an untrained player_2 beats or draws a random one at
        # times), older ones decayed; the counts travel in the checkpoint
        p2 = prio.seat_results["player_2"]
        assert p2["win"] + p2["draw"] > 0 and sum(p2.values()) <= 100.0
        again = _vs_random_collector("win_rate", seed=1)
        try:
            again.load_state_dict(prio.state_dict())
            np.testing.assert_allclose(again.seat_weights(), prio.seat_weights())
        finally:
            again.close()
    finally:
        uniform.close()
        prio.close()


def test_a_linear_lr_schedule_decays_the_shared_policys_learning_rate_over_the_self_play_run(tmp_path):
    """``policy.kwargs.lr_schedule`` reaches the multi-agent learner: each update's rate is the schedule's at the
    run's env steps over ``total_env_steps`` (constant stays at ``learning_rate``)."""
    from polar.algorithms.ppo import schedule_value

    rates: dict[str, list[tuple[int, float]]] = {}
    for schedule in ("linear", "constant"):
        cfg = _cfg({"id": TTT, "self_play": {"random_share": 0.3}}, steps=800,
                   kwargs={"learning_rate": 1e-3, "lr_schedule": schedule}, eval={"at_end": False})
        _, _, rows = _train(cfg, tmp_path, schedule)
        rates[schedule] = [(r["env_steps"], r["learning_rate"]) for r in rows]
    assert len(rates["linear"]) >= 3
    for env_steps, lr in rates["linear"]:  # the update after a batch runs at the steps counted with it
        assert lr == pytest.approx(schedule_value(1e-3, "linear", env_steps / 800))
    linear = [lr for _, lr in rates["linear"]]
    assert linear == sorted(linear, reverse=True) and linear[-1] < 0.5e-3
    assert {lr for _, lr in rates["constant"]} == {1e-3}


def test_evaluations_during_a_self_play_run_do_not_change_its_training(tmp_path):
    """A run evaluated every iteration trains exactly as the same run never evaluated: evaluation games (argmax moves,
    their own env and random player) draw nothing from the training's random streams and leave the pool's scores
    alone, so runs scored with ``eval.every_n_iterations: 0`` stand for the example as shipped."""
    sp = {"snapshot_every_n_iterations": 1, "pool_size": 3, "sampling": "win_rate", "random_share": 0.3,
          "eval_games": 6}
    runs = {}
    for every in (1, 0):
        cfg = _cfg({"id": TTT, "self_play": sp}, steps=1600, eval={"every_n_iterations": every, "at_end": False})
        trainer, _, rows = _train(cfg, tmp_path, f"every{every}")
        runs[every] = (trainer, rows)
    (evaluated, eval_rows), (plain, plain_rows) = runs[1], runs[0]
    assert any("eval/vs_pool/win_rate" in r for r in eval_rows)
    assert not any("eval/vs_random/win_rate" in r for r in plain_rows)
    assert len(eval_rows) == len(plain_rows) >= 4
    assert [(s.snapshot_id, s.wins, s.draws, s.losses) for s in evaluated.learner.pool.snapshots] == \
        [(s.snapshot_id, s.wins, s.draws, s.losses) for s in plain.learner.pool.snapshots]
    for k, v in plain.learner.policies["shared"].state_dict().items():
        assert torch.equal(evaluated.learner.policies["shared"].state_dict()[k], v), k
