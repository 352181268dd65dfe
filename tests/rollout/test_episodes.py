"""The one env-episode loop (``polar.rollout.episodes``): evaluation, the evaluation suite's env jobs, ``polar eval
--record`` and ``polar collect`` all play their episodes through it, and they give the numbers they gave before
they shared it (``data/episodes_before.json``: recorded from the five separate loops, commit 12f6413, on the same
seeds and seeded policy initialisations)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import polar.rollout.episodes as episodes
from polar.config import RunConfig, load_config, validate
from polar.harness import make_env
from polar.models.policy import Policy, build_policy
from tests.evaluation.helpers import EXAMPLES, make_env_run

BEFORE = json.loads((Path(__file__).parent / "data" / "episodes_before.json").read_text())


def cfg_of(env_id: str, agent: str | None = None):
    data = {"name": "x", "harness": {"type": "gymnasium", "id": env_id}, "policy": {"type": "ppo"},
            "distribution": {"backend": "local"}, "logging": {"tensorboard": False, "progress_bar": False}}
    if agent:
        data["agent"] = {"type": agent}
    return validate(RunConfig, data)


def policy_of(cfg, seed: int) -> Policy:
    env = make_env(cfg.harness, cfg.config_dir)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    torch.manual_seed(seed)
    policy = build_policy(cfg, obs_space, act_space, cfg.config_dir)
    policy.eval()
    return policy


def r6(x: float) -> float:
    return round(float(x), 6)


def same(got, want) -> bool:
    """Equal, floats to 1e-5 relative (the old numbers were recorded outside pytest, whose torch threads may
    sum in another order)."""
    if isinstance(want, float) or isinstance(got, float):
        return got == pytest.approx(want, rel=1e-5, abs=1e-6)
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(same, got, want))
    return got == want


def test_eval_suite_record_and_collect_all_play_through_the_one_episode_loop(tmp_path, monkeypatch):
    """One change in the shared loop (its action conversion always pushes CartPole left) is seen by all four:
    every episode ends in the ~10 steps pushing left takes, every recorded and collected action is 0."""
    from polar.evaluation.runner import env_job
    from polar.evaluation.suite import EvalSuite
    from polar.trainers.evaluation import evaluate_policy
    from polar.trainers.recording import record_episodes

    calls = []
    real = episodes.to_env_actions

    def always_left(agent, action, n, space):
        calls.append(n)
        return np.zeros_like(real(agent, action, n, space))

    monkeypatch.setattr(episodes, "to_env_actions", always_left)
    cfg = cfg_of("CartPole-v1")
    policy = policy_of(cfg, 3)

    res = evaluate_policy(policy, cfg.harness, 6, 123, True, 3)
    assert res["episodes"] == 6 and max(res["lengths"]) <= 12, res["lengths"]  # upright for 500 steps otherwise
    n_eval = len(calls)
    assert n_eval > 0

    run = make_env_run(tmp_path / "cart", EXAMPLES / "cartpole_ppo.yaml", seeds=(1,))
    suite = EvalSuite.model_validate({
        "policies": [{"name": "p", "run": str(run)}],
        "harnesses": [{"name": "cart", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
                       "seeds": {"start": 1_000_000, "count": 4}, "num_envs": 2}]})
    recs = env_job(suite, suite.harnesses[0], suite.policies[0])
    assert [r["seed"] for r in recs] == list(range(1_000_000, 1_000_004))
    assert all(r["episode_length"] <= 12 and r["terminated"] for r in recs), recs
    n_suite = len(calls) - n_eval
    assert n_suite > 0

    out = record_episodes(policy, cfg.harness, tmp_path / "rec", 2, 50, True, max_steps=100)
    index = json.loads((out / "index.json").read_text())
    for ep in index["episodes"]:
        rows = [json.loads(line) for line in (out / ep["id"] / "steps.jsonl").read_text().splitlines()]
        assert [row["action"] for row in rows[1:]] == [0] * ep["length"] and ep["length"] <= 12
    n_record = len(calls) - n_eval - n_suite
    assert n_record > 0

    eps = list(episodes.collect_episodes(policy, cfg.harness, 2, seed=77))
    assert len(eps) == 2 and all((e.actions == 0).all() and len(e.actions) <= 12 for e in eps)
    assert len(calls) - n_eval - n_suite - n_record == sum(len(e.actions) for e in eps)


@pytest.mark.parametrize("env_id,agent", [("CartPole-v1", None), ("Pendulum-v1", None), ("CartPole-v1", "lstm")])
def test_evaluation_gives_the_numbers_it_gave_before_the_shared_loop(env_id, agent):
    from polar.trainers.evaluation import evaluate_policy

    key = env_id + ("-lstm" if agent else "")
    cfg = cfg_of(env_id, agent)
    policy = policy_of(cfg, 3)
    for det in (True, False):
        want = BEFORE.get(f"eval/{key}/{det}")
        if want is None:
            continue
        torch.manual_seed(5)
        res = evaluate_policy(policy, cfg.harness, 7, 123, det, 3, None)
        assert res["lengths"] == want["lengths"] and res["episodes"] == want["episodes"]
        assert [r6(x) for x in res["returns"]] == pytest.approx(want["returns"], rel=1e-5)
    if env_id == "CartPole-v1" and not agent:  # max_episode_steps cuts every copy's episode: all restart
        for det in (True, False):
            torch.manual_seed(5)
            res = evaluate_policy(policy, cfg.harness, 7, 123, det, 3, None, max_episode_steps=30)
            assert res["lengths"] == BEFORE[f"evalcut/{det}"]["lengths"]


def test_evaluation_of_a_connector_game_gives_the_numbers_it_gave_before():
    """The key-door game through its connector (one process for both copies), stochastic, episodes cut at 45."""
    from polar.trainers.evaluation import evaluate_policy

    cfg = load_config(EXAMPLES / "keydoor" / "demo.yaml")
    policy = policy_of(cfg, 4)
    torch.manual_seed(5)
    res = evaluate_policy(policy, cfg.harness, 5, 321, False, 2, cfg.config_dir, max_episode_steps=45)
    want = BEFORE["eval/keydoor"]
    assert res["lengths"] == want["lengths"] and res["success_rate"] == want["success"]
    assert [r6(x) for x in res["returns"]] == pytest.approx(want["returns"], rel=1e-5)


@pytest.mark.parametrize("key", ["CartPole-v1/True", "CartPole-v1/False", "Pendulum-v1/False", "CartPole-v1-lstm/False"])
def test_the_suites_episodes_give_the_numbers_they_gave_before(key):
    from polar.evaluation.episodes import make_envs, run_env_episodes

    name, det = key.rsplit("/", 1)
    env_id = name.removesuffix("-lstm")
    cfg = cfg_of(env_id, "lstm" if name.endswith("-lstm") else None)
    policy = policy_of(cfg, 3)
    torch.manual_seed(5)
    envs = make_envs(lambda: make_env(cfg.harness, None), 3)
    try:
        recs = run_env_episodes(episodes.PolicyActor(policy), envs, list(range(1000, 1007)), det == "True",
                                60 if env_id == "CartPole-v1" else 100_000)
    finally:
        for e in envs:
            e.close()
    want = BEFORE[f"suite/{key}"]
    assert [rec["return"] for rec in recs] == pytest.approx([w["return"] for w in want], rel=1e-5)
    assert [{k: v for k, v in rec.items() if k not in ("return", "time_to_completion_s", "info_counts")}
            for rec in recs] == [{k: v for k, v in w.items() if k != "return"} for w in want]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_recording_gives_the_frames_it_gave_before(env_id, tmp_path):
    from polar.trainers.recording import record_episodes

    cfg = cfg_of(env_id)
    policy = policy_of(cfg, 3)
    torch.manual_seed(5)
    out = record_episodes(policy, cfg.harness, tmp_path, 2, 50, True, None, max_steps=40)
    index = json.loads((out / "index.json").read_text())
    want = BEFORE[f"record/{env_id}"]
    assert same(index["episodes"], want["episodes"])
    steps = [[json.loads(line) for line in (out / e["id"] / "steps.jsonl").read_text().splitlines()]
             for e in index["episodes"]]
    assert same(steps, want["steps"])
    assert all((out / e["id"] / s["frame"]).is_file() for e, st in zip(index["episodes"], steps, strict=True)
               for s in st)


@pytest.mark.parametrize("key,det,epsilon", [("CartPole-v1", True, 0.0), ("Pendulum-v1", False, 0.3),
                                             ("CartPole-v1-lstm", True, 0.0)])
def test_collect_gives_the_episodes_it_gave_before(key, det, epsilon):
    env_id = key.removesuffix("-lstm")
    cfg = cfg_of(env_id, "lstm" if key.endswith("-lstm") else None)
    policy = policy_of(cfg, 3)
    torch.manual_seed(5)
    eps = list(episodes.collect_episodes(policy, cfg.harness, 3, seed=77, deterministic=det, epsilon=epsilon,
                                         max_episode_steps=45))
    got = [{"obs_sum": r6(e.observations.sum()), "obs_shape": list(e.observations.shape),
            "actions": np.round(e.actions.astype(float), 5).ravel().tolist(), "rewards_sum": r6(e.rewards.sum()),
            "terms": e.terminations.tolist(), "truncs": e.truncations.tolist(), "seed": e.seed} for e in eps]
    want = BEFORE[f"collect/{key}/{det}"]
    for g, w in zip(got, want, strict=True):
        assert g["obs_sum"] == pytest.approx(w["obs_sum"], rel=1e-5, abs=1e-5)
        assert g["actions"] == pytest.approx(w["actions"], abs=1e-5)
        assert {k: v for k, v in g.items() if k not in ("obs_sum", "actions")} == \
            {k: v for k, v in w.items() if k not in ("obs_sum", "actions")}


class _Countdown(gym.Env):
    """Observation: steps left. Action 1 ends the episode (terminated); at ``limit`` steps it is truncated."""

    def __init__(self, limit: int = 4) -> None:
        self.observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.limit, self.t = limit, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.limit], np.float32), {}

    def step(self, action):
        self.t += 1
        term = int(action) == 1
        return np.array([self.limit - self.t], np.float32), 1.0, term, self.t >= self.limit and not term, \
            {"success": term}


class _StepCounter:
    """An actor whose recurrent state counts the steps since its row's episode began; acts 1 at ``stop_at``."""

    def __init__(self, stop_at: int) -> None:
        self.stop_at, self.seen = stop_at, []
        self.agent = type("A", (), {})()

    def get_initial_state(self, n):
        return torch.zeros(n)

    def reset_state(self, state, initial, starts):
        from polar.agents import reset_state

        return reset_state(state, initial, starts)

    def act(self, obs, state, deterministic=True):
        self.seen.append(state.clone())
        return (state + 1 == self.stop_at).long(), state + 1, {}


@pytest.mark.parametrize("vector", [False, True])
def test_the_loop_keeps_terminated_truncated_and_cut_apart_and_resets_state_per_episode(vector):
    from polar.rollout.episodes import EnvSlots, EpisodePlan, VectorSlots, run_episodes

    def results(stop_at, limit, max_steps):
        if vector:
            slots = VectorSlots(gym.vector.SyncVectorEnv([lambda: _Countdown(limit)],
                                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
        else:
            slots = EnvSlots([_Countdown(limit)])
        actor = _StepCounter(stop_at)
        out = run_episodes(actor, slots, EpisodePlan.seeded([1, 2, 3]), max_episode_steps=max_steps)
        slots.close()
        # the state restarts at every episode: the actor sees 0, 1, ..., len - 1 in each
        assert torch.cat(actor.seen).tolist() == [float(t) for r in out for t in range(r.length)]
        return [(r.seed, r.length, r.terminated, r.truncated, r.success) for r in out]

    assert results(stop_at=2, limit=4, max_steps=100) == [(s, 2, True, False, True) for s in (1, 2, 3)]
    assert results(stop_at=9, limit=4, max_steps=100) == [(s, 4, False, True, False) for s in (1, 2, 3)]
    assert results(stop_at=9, limit=4, max_steps=3) == [(s, 3, False, True, False) for s in (1, 2, 3)]  # cut
