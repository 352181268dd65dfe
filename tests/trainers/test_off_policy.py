"""The off-policy path end to end: next_obs from the runner and through worker shared memory, short DQN/SAC
runs through the composed loop (``polar.trainers.build.compose``) (in the learner, in worker processes, on Ray), checkpoints with their replay
buffer, resume, ``polar eval``, and the errors a wrong env or agent gets."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

from polar.buffers.replay_buffer import PrioritizedReplayBuffer
from polar.config.base import validate
from polar.config.run import RunConfig
from polar.errors import CheckpointError, ConfigError
from polar.metrics.logger import read_metrics
from polar.models.policy import build_policy
from polar.rollout.runner import EnvRunner, runner_options
from polar.rollout.worker import META_FIELDS, fragment_arrays, fragment_from_arrays
from polar.trainers.build import compose
from polar.trainers.checkpoint import load_checkpoint
from polar.trainers.run_dir import RunDir

TERMINATE_AT, TIME_LIMIT = 3, 5


class CounterEnv(gym.Env):
    """obs = (steps taken in this episode, episodes started so far). Odd-numbered episodes terminate at step
    ``TERMINATE_AT``; the others run into the ``TimeLimit`` at ``TIME_LIMIT``, so both kinds of ending occur."""

    action_space = spaces.Discrete(2)

    def __init__(self, dict_obs: bool = False) -> None:
        self.dict_obs = dict_obs
        box = spaces.Box(0.0, 1e4, shape=(1,), dtype=np.float32)
        self.observation_space = spaces.Dict({"step": box, "episode": box}) if dict_obs else spaces.Box(
            0.0, 1e4, shape=(2,), dtype=np.float32)
        self.episode = -1

    def _obs(self):
        if self.dict_obs:
            return {"step": np.array([self.t], np.float32), "episode": np.array([self.episode], np.float32)}
        return np.array([self.t, self.episode], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.episode % 2 == 1 and self.t == TERMINATE_AT, False, {}


INF_BOX_ID = "PolarTestInfiniteBox-v0"


class InfiniteBoxEnv(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    action_space = spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, True, {}


if INF_BOX_ID not in gym.registry:
    gym.register(INF_BOX_ID, entry_point=InfiniteBoxEnv)


def counter_runner(dict_obs: bool, keep_next_obs: bool, num_envs: int = 2) -> EnvRunner:
    env = gym.vector.SyncVectorEnv([lambda: TimeLimit(CounterEnv(dict_obs), TIME_LIMIT)] * num_envs,
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "dqn"},
                               "agent": {"type": "mlp", "hidden_sizes": [8]}})
    policy = build_policy(cfg, env.single_observation_space, env.single_action_space)
    return EnvRunner(env, policy, seed=0, keep_next_obs=keep_next_obs)


def step_and_episode(obs) -> tuple[np.ndarray, np.ndarray]:
    """[T, N] step counters and episode numbers of a fragment's obs or next_obs (plain or Dict)."""
    if isinstance(obs, dict):
        return obs["step"][..., 0], obs["episode"][..., 0]
    return obs[..., 0], obs[..., 1]


# ------------------------------------------------------------------ next_obs from the runner


@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
def test_runner_next_obs_is_the_next_observation_and_the_final_one_where_episodes_end(dict_obs):
    runner = counter_runner(dict_obs, keep_next_obs=True)
    first, second = runner.collect(12), runner.collect(12)
    for frag in (first, second):
        step, episode = step_and_episode(frag.obs)
        next_step, next_episode = step_and_episode(frag.next_obs)
        # the observation after step t is always one step further into the same episode, also where it ended
        np.testing.assert_array_equal(next_step, step + 1)
        np.testing.assert_array_equal(next_episode, episode)
        term, trunc = frag.terminated.astype(bool), frag.truncated.astype(bool)
        assert term.any() and trunc.any() and not (term & trunc).any()
        assert (next_step[term] == TERMINATE_AT).all() and (next_step[trunc] == TIME_LIMIT).all()
        # within an episode next_obs[t] is obs[t + 1]; where it ended, obs[t + 1] is the reset observation
        done = (term | trunc)[:-1]
        np.testing.assert_array_equal(next_step[:-1][~done], step[1:][~done])
        np.testing.assert_array_equal(next_episode[:-1][~done], episode[1:][~done])
        assert (step[1:][done] == 0).all() and (episode[1:][done] == episode[:-1][done] + 1).all()
    # across the fragment boundary: the first fragment's last next_obs is the second's first obs
    last_done = (first.terminated[-1] + first.truncated[-1]).astype(bool)
    s2, e2 = step_and_episode(second.obs)
    ns1, ne1 = step_and_episode(first.next_obs)
    np.testing.assert_array_equal(ns1[-1][~last_done], s2[0][~last_done])
    np.testing.assert_array_equal(ne1[-1][~last_done], e2[0][~last_done])


def test_runner_without_keep_next_obs_records_none():
    frag = counter_runner(False, keep_next_obs=False).collect(8)
    assert frag.next_obs is None
    ppo = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"}})
    assert runner_options(ppo)["keep_next_obs"] is False
    for algo in ("dqn", "sac"):
        off = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": algo}})
        assert runner_options(off)["keep_next_obs"] is True


@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
def test_next_obs_survives_the_worker_shared_memory_round_trip(dict_obs):
    frag = counter_runner(dict_obs, keep_next_obs=True).collect(12)
    arrays = fragment_arrays(frag)
    # what the worker does: copy into shared-memory tensors; the learner reads them back as numpy
    shared = {k: torch.from_numpy(np.ascontiguousarray(v)).clone().share_memory_().numpy() for k, v in arrays.items()}
    back = fragment_from_arrays(shared, {k: getattr(frag, k) for k in META_FIELDS})
    if dict_obs:
        assert isinstance(back.next_obs, dict) and set(back.next_obs) == {"step", "episode"}
        assert isinstance(back.obs, dict) and set(back.obs) == {"step", "episode"}
        for k in ("step", "episode"):
            np.testing.assert_array_equal(back.next_obs[k], frag.next_obs[k])
            np.testing.assert_array_equal(back.obs[k], frag.obs[k])
    else:
        np.testing.assert_array_equal(back.next_obs, frag.next_obs)
        np.testing.assert_array_equal(back.obs, frag.obs)
    np.testing.assert_array_equal(back.terminated, frag.terminated)
    np.testing.assert_array_equal(back.truncated, frag.truncated)

    plain = counter_runner(dict_obs, keep_next_obs=False).collect(4)
    arrays = fragment_arrays(plain)
    assert not any(k.startswith("next_obs") for k in arrays)
    assert fragment_from_arrays(arrays, {k: getattr(plain, k) for k in META_FIELDS}).next_obs is None


# ------------------------------------------------------------------ short runs through the trainer

DQN_KWARGS = {"learning_starts": 100, "batch_size": 16, "buffer_size": 5000, "train_freq": 4, "gradient_steps": 1,
              "target_update_interval": 100, "learning_rate": 1e-3}
SAC_KWARGS = {"learning_starts": 100, "batch_size": 16, "buffer_size": 5000, "train_freq": 8, "gradient_steps": 1}


def off_policy_cfg(algo: str, total: int = 2000, workers: int = 0, env_id: str | None = None, agent=None,
                   dist=None, **kwargs):
    default_env = "CartPole-v1" if algo == "dqn" else "Pendulum-v1"
    base = DQN_KWARGS if algo == "dqn" else SAC_KWARGS
    return validate(RunConfig, {
        "name": f"{algo}-test", "seed": 0,
        "harness": {"type": "gymnasium", "id": env_id or default_env},
        "agent": agent or {"type": "mlp", "hidden_sizes": [32, 32]},
        "policy": {"type": algo, "kwargs": {**base, **kwargs}},
        "distribution": {"rollout_workers": workers, "envs_per_worker": 2, **(dist or {})},
        "total_env_steps": total,
        "logging": {"tensorboard": False, "checkpoint_freq": 1, "progress_bar": False},
        "eval": {"at_end": False, "episodes": 3, "num_envs": 3},
    })


def recording(loop):
    """Notes which worker every fragment that reached the replay buffer came from (``loop.fragment_workers``).

    Fragments are held back until every worker has delivered one (then handed over in arrival order), so a
    worker that starts late on a loaded machine still feeds the replay before a short run ends.
    """
    loop.fragment_workers = []
    replay, backend = loop.collector.replay, loop.collector.backend
    add, fetch = replay.add_fragment, backend.next_fragment
    held, seen = [], set()

    def add_fragment(frag):
        loop.fragment_workers.append(frag.worker_id)
        return add(frag)

    def next_fragment(timeout_s=None):
        while len(seen) < backend.num_workers:
            frag = fetch(timeout_s)
            seen.add(frag.worker_id)
            held.append(frag)
        return held.pop(0) if held else fetch(timeout_s)

    replay.add_fragment = add_fragment
    backend.next_fragment = next_fragment
    return loop


def train(cfg, path, resume: bool = False, wrap=lambda loop: loop):
    run = RunDir.open(path) if resume else RunDir.create(cfg.name, path)
    trainer = wrap(compose(cfg, run, resume=resume))
    return trainer.train(), trainer


def replay_files(path) -> list[str]:
    return sorted(p.name for p in (path / "checkpoints").glob("replay_*.npz"))


def replay_header(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return json.loads(str(z["header"][()]))


def assert_checkpointed_with_a_replay_per_checkpoint(path, env_steps: int) -> dict:
    ckpts = sorted(p.name for p in (path / "checkpoints").glob("ckpt_*.pt"))
    assert ckpts == ["ckpt_00000001.pt", "ckpt_00000002.pt"]
    assert replay_files(path) == ["replay_00000001.npz", "replay_00000002.npz"]  # one per kept checkpoint
    assert load_checkpoint(path / "checkpoints" / "ckpt_00000001.pt")["replay_file"] == "replay_00000001.npz"
    state = load_checkpoint(path / "checkpoints" / "ckpt_00000002.pt")
    assert state["replay_file"] == "replay_00000002.npz" and state["env_steps"] == env_steps
    assert replay_header(path / "checkpoints" / "replay_00000002.npz")["size"] == env_steps
    return state


# fragments of 4 steps x 2 envs = 8 transitions; one gradient step each from env_steps >= learning_starts (104)
DQN_UPDATES_AT = {1000: (1000 - 104) // 8 + 1, 2000: (2000 - 104) // 8 + 1}


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory):
    """One finished 2000-step DQN run (2 iterations, a checkpoint each); tests copy it before changing it."""
    path = tmp_path_factory.mktemp("dqn") / "run"
    result, trainer = train(off_policy_cfg("dqn"), path)
    return result, trainer, path


def copy_run(src, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst


def test_dqn_run_logs_metrics_and_checkpoints_its_replay_buffer(dqn_run):
    result, trainer, path = dqn_run
    assert result["env_steps"] == 2000 and result["iterations"] == 2 and result["episodes"] > 0
    rows = read_metrics(path / "metrics.jsonl")
    assert [r["env_steps"] for r in rows] == [1000, 2000]
    for key in ("replay_size", "loss", "q_mean", "exploration_rate", "n_updates", "episode_reward_mean"):
        assert all(r.get(key) is not None for r in rows), key
    assert [r["replay_size"] for r in rows] == [1000, 2000]
    assert [r["n_updates"] for r in rows] == [DQN_UPDATES_AT[1000], DQN_UPDATES_AT[2000]]
    # exploration_fraction 0.1 of 2000 steps: epsilon reached its final value long before the first log
    assert rows[-1]["exploration_rate"] == pytest.approx(0.05)
    assert np.isfinite(rows[-1]["loss"])
    state = assert_checkpointed_with_a_replay_per_checkpoint(path, 2000)
    assert state["learner"]["n_updates"] == DQN_UPDATES_AT[2000] == trainer.learner.algorithm.n_updates


def test_sac_run_logs_metrics_and_resume_restores_critics_targets_and_temperature(tmp_path):
    path = tmp_path / "run"
    result, trainer = train(off_policy_cfg("sac", ent_coef="auto_0.5"), path)
    # fragments of 8 steps x 2 envs: 1008 transitions make the first iteration, 2000 the second
    assert result["env_steps"] == 2000 and result["iterations"] == 2
    rows = read_metrics(path / "metrics.jsonl")
    for key in ("replay_size", "critic_loss", "actor_loss", "ent_coef", "entropy", "n_updates"):
        assert all(r.get(key) is not None for r in rows), key
    assert [r["replay_size"] for r in rows] == [1008, 2000]
    assert 0 < rows[0]["ent_coef"] < 0.5  # learned from 0.5, lowered while entropy is above -dim(action)
    assert_checkpointed_with_a_replay_per_checkpoint(path, 2000)

    again = compose(trainer.cfg.model_copy(update={"total_env_steps": 3000}), RunDir.open(path), resume=True)
    again.restore()
    try:
        saved, loaded = trainer.learner.algorithm, again.learner.algorithm
        assert loaded.n_updates == saved.n_updates > 0
        for name in ("critics", "critic_target"):
            for k, v in getattr(saved, name).state_dict().items():
                assert torch.equal(getattr(loaded, name).state_dict()[k], v), (name, k)
        assert torch.equal(loaded.log_ent_coef.detach(), saved.log_ent_coef.detach())
        for opt in ("actor_optimizer", "critic_optimizer", "ent_coef_optimizer"):
            a, b = getattr(saved, opt), getattr(loaded, opt)
            assert a.step_count == b.step_count > 0 and torch.equal(a.exp_avg, b.exp_avg), opt
        assert len(again.collector.replay) == 2000 and float(again.learner.parts.policy.agent.explore_uniform) == 0.0
    finally:
        again.collector.close()


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_runs_with_two_worker_processes_fill_the_replay_from_both(algo, tmp_path):
    path = tmp_path / "run"
    extra = {"prioritized_replay": True, "double_q": True} if algo == "dqn" else {}
    cfg = off_policy_cfg(algo, total=1000, workers=2, **extra)
    result, trainer = train(cfg, path, wrap=recording)
    assert result["env_steps"] >= 1000
    assert set(trainer.fragment_workers) == {0, 1}
    assert len(trainer.collector.replay) == result["env_steps"]  # every collected transition is in the buffer
    rows = read_metrics(path / "metrics.jsonl")
    assert rows[-1]["replay_size"] == result["env_steps"]
    assert rows[-1]["exploration_rate" if algo == "dqn" else "ent_coef"] is not None
    assert rows[-1]["loss" if algo == "dqn" else "critic_loss"] is not None
    assert trainer.learner.algorithm.n_updates > 0
    assert replay_files(path) == ["replay_00000001.npz"]
    assert load_checkpoint(path / "checkpoints" / "ckpt_00000001.pt")["replay_file"] == "replay_00000001.npz"
    header = replay_header(path / "checkpoints" / "replay_00000001.npz")
    assert header["size"] == result["env_steps"]
    if algo == "dqn":  # prioritized: sampled transitions got their |TD error|, new ones the max priority seen
        assert isinstance(trainer.collector.replay, PrioritizedReplayBuffer) and header["kind"] == "PrioritizedReplayBuffer"
        stored = trainer.collector.replay.priorities[:len(trainer.collector.replay)]
        assert len(np.unique(stored)) > 10 and stored.max() == pytest.approx(trainer.collector.replay.max_priority)


def test_n_step_run_with_two_workers_stores_n_step_transitions(tmp_path):
    """n_step_return: 3 through worker processes: every transition but the last 2 per env stream reaches the
    buffer, spanning 3 steps unless its episode ended sooner.

    The workers act uniformly at random (epsilon stays 1): episodes then do not depend on the weights the
    learner happened to publish between first-ready fragments, so the share of 3-step windows is set by the
    seeds (about 0.91). With the learned greedy policy, episodes of ~10 steps put that share at 0.804-0.809,
    varying with how the two workers' fragments interleave: a hair above the bound below."""
    cfg = off_policy_cfg("dqn", total=1000, workers=2, n_step_return=3, exploration_final_eps=1.0)
    result, trainer = train(cfg, tmp_path / "run")
    streams = 2 * 2  # workers x envs_per_worker
    held = streams * (3 - 1)
    assert result["env_steps"] - held <= len(trainer.collector.replay) <= result["env_steps"]
    steps = trainer.collector.replay._steps[:len(trainer.collector.replay)]
    assert set(np.unique(steps).tolist()) <= {1.0, 2.0, 3.0} and (steps == 3.0).mean() > 0.8
    assert (steps < 3.0).any()  # CartPole episodes end inside windows
    assert trainer.learner.algorithm.n_updates > 0


# ------------------------------------------------------------------ resume


def test_resume_restores_replay_counters_target_and_optimizer(dqn_run, tmp_path, caplog):
    _, first, src = dqn_run
    path = copy_run(src, tmp_path)
    cfg = first.cfg.model_copy(update={"total_env_steps": 3000})

    with caplog.at_level(logging.INFO, logger="polar.rollout.backends.replay"):
        loaded = compose(cfg, RunDir.open(path), resume=True)
        loaded.restore()
    try:
        assert "replay buffer restored: 2000 transitions" in caplog.text
        assert len(loaded.collector.replay) == 2000 and loaded.collector.replay.pos == first.collector.replay.pos
        np.testing.assert_array_equal(loaded.collector.replay._obs[""], first.collector.replay._obs[""])
        np.testing.assert_array_equal(loaded.collector.replay._next_obs[""], first.collector.replay._next_obs[""])
        np.testing.assert_array_equal(loaded.collector.replay._actions, first.collector.replay._actions)
        assert loaded.collector.replay.rng.bit_generator.state == first.collector.replay.rng.bit_generator.state
        assert loaded.learner.algorithm.n_updates == first.learner.algorithm.n_updates == DQN_UPDATES_AT[2000]
        assert loaded.learner.algorithm.last_target_update == first.learner.algorithm.last_target_update > 0
        for k, v in first.learner.algorithm.target.state_dict().items():
            assert torch.equal(loaded.learner.algorithm.target.state_dict()[k], v), k
        for k, v in first.learner.parts.policy.state_dict().items():
            assert torch.equal(loaded.learner.parts.policy.state_dict()[k], v), k
        a, b = first.learner.algorithm.optimizer, loaded.learner.algorithm.optimizer
        assert a.step_count == b.step_count == DQN_UPDATES_AT[2000]
        assert torch.equal(a.exp_avg, b.exp_avg) and torch.equal(a.exp_avg_sq, b.exp_avg_sq)
        assert float(loaded.learner.parts.policy.agent.explore_uniform) == 0.0
        assert float(loaded.learner.parts.policy.agent.epsilon) == pytest.approx(loaded.learner.algorithm.exploration_rate(2000))
    finally:
        loaded.collector.close()

    result, resumed = train(cfg, path, resume=True)
    assert result["env_steps"] == 3000 and resumed.iteration == 3
    # a gradient step after every fragment from the first one on: the restored buffer needs no warm-up
    assert resumed.learner.algorithm.n_updates == DQN_UPDATES_AT[2000] + 1000 // 8
    rows = read_metrics(path / "metrics.jsonl")
    assert [r["replay_size"] for r in rows] == [1000, 2000, 3000]
    assert [r["n_updates"] for r in rows][-1] == DQN_UPDATES_AT[2000] + 125
    # keep_checkpoints 3: every checkpoint and its replay file are still there
    assert replay_files(path) == ["replay_00000001.npz", "replay_00000002.npz", "replay_00000003.npz"]


def test_resume_without_a_saved_replay_buffer_warns_and_refills(tmp_path, caplog):
    path = tmp_path / "run"
    cfg = off_policy_cfg("dqn", total=1000, save_replay_buffer=False)
    train(cfg, path)
    assert replay_files(path) == []
    assert load_checkpoint(path / "checkpoints" / "ckpt_00000001.pt")["replay_file"] is None
    with caplog.at_level(logging.WARNING, logger="polar.rollout.backends.replay"):
        result, resumed = train(cfg.model_copy(update={"total_env_steps": 2000}), path, resume=True)
    assert any(r.levelno == logging.WARNING and "no replay buffer" in r.getMessage() for r in caplog.records)
    assert result["env_steps"] == 2000
    assert len(resumed.collector.replay) == 1000  # only what was collected after the resume
    # training waits until batch_size (16) transitions are back: the first 8-transition fragment is skipped
    assert resumed.learner.algorithm.n_updates == DQN_UPDATES_AT[1000] + 1000 // 8 - 1
    assert replay_files(path) == []


def test_resume_from_a_checkpoint_whose_replay_file_is_missing_names_the_file(dqn_run, tmp_path):
    _, first, src = dqn_run
    path = copy_run(src, tmp_path)
    (path / "checkpoints" / "replay_00000002.npz").unlink()
    trainer = compose(first.cfg.model_copy(update={"total_env_steps": 3000}), RunDir.open(path), resume=True)
    with pytest.raises(CheckpointError, match=r"replay_00000002\.npz"):
        trainer.train()


def test_polar_eval_reads_a_finished_dqn_run(dqn_run, tmp_path):
    path = copy_run(dqn_run[2], tmp_path)
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "eval", str(path), "--episodes", "3"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "return mean" in p.stdout and "ckpt_00000002.pt" in p.stdout
    evals = sorted((path / "eval").glob("eval_ckpt_00000002_*.json"))
    assert len(evals) == 1
    res = json.loads(evals[0].read_text())
    assert res["episodes"] == 3 and res["env_steps"] == 2000 and res["return_mean"] >= 1.0


# ------------------------------------------------------------------ wrong env or agent


@pytest.mark.parametrize("algo, env_id, words", [
    ("dqn", "Pendulum-v1", ("Discrete", "sac")),
    ("sac", "CartPole-v1", ("Box", "dqn")),
    ("sac", INF_BOX_ID, ("finite", "low=")),
])
def test_an_action_space_the_algorithm_cannot_handle_is_a_config_error(algo, env_id, words, tmp_path):
    with pytest.raises(ConfigError) as err:
        compose(off_policy_cfg(algo, env_id=env_id), RunDir.create("bad", tmp_path / "run")).train()
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("agent", [{"type": "lstm"}, {"type": "custom", "module": "my_agent", "class_name": "Agent"}],
                         ids=["lstm", "custom"])
def test_recurrent_and_custom_agents_are_config_errors_for_dqn(agent, tmp_path):
    with pytest.raises(ConfigError, match=rf"agent\.type '{agent['type']}'.*(ppo|appo)"):
        compose(off_policy_cfg("dqn", agent=agent), RunDir.create("bad", tmp_path / "run")).train()


# ------------------------------------------------------------------ Ray


@pytest.mark.ray
@pytest.mark.slow
def test_dqn_on_ray_fills_the_replay_from_both_rollout_actors(ray_cluster, tmp_path):
    dist = {"backend": "ray", "coordinator_address": ray_cluster.address, "rollout_resources": {"num_cpus": 0.5}}
    cfg = off_policy_cfg("dqn", total=2000, workers=2, dist=dist)
    result, trainer = train(cfg, tmp_path / "run", wrap=recording)
    assert result["env_steps"] >= 2000
    assert set(trainer.fragment_workers) == {0, 1}
    assert len(trainer.collector.replay) == result["env_steps"] and trainer.learner.algorithm.n_updates > 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rows[-1]["replay_size"] == result["env_steps"] and rows[-1]["loss"] is not None


@pytest.mark.ray
@pytest.mark.slow
def test_dqn_through_the_ray_learner_actor_checkpoints_its_replay(ray_cluster, tmp_path):
    """What ``polar run`` does with ``backend: ray``: the trainer in a learner actor, rollout actors feeding it."""
    from polar.trainers.build import build_trainer

    dist = {"backend": "ray", "coordinator_address": ray_cluster.address, "rollout_resources": {"num_cpus": 0.5}}
    cfg = off_policy_cfg("dqn", total=2000, workers=2, dist=dist)
    run = RunDir.create(cfg.name, tmp_path / "run")
    result = build_trainer(cfg, run).train()
    assert result["env_steps"] >= 2000
    ckpts = sorted((run.path / "checkpoints").glob("ckpt_*.pt"))
    latest = load_checkpoint(ckpts[-1])
    # one replay file per kept checkpoint, each named by its checkpoint (as in the local runs above)
    assert replay_files(run.path) == sorted(load_checkpoint(c)["replay_file"] for c in ckpts)
    assert latest["replay_file"] == f"replay_{int(ckpts[-1].stem.removeprefix('ckpt_')):08d}.npz"
    assert replay_header(run.path / "checkpoints" / latest["replay_file"])["size"] == latest["env_steps"]
    assert latest["learner"]["n_updates"] > 0
