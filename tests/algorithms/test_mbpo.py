"""MBPO's mechanics (polar.algorithms.mbpo): the ensemble's Gaussian NLL fit on a known linear system, k-step
rollouts branched from real states, termination (learned, and the env rules against the real MuJoCo envs), the
real:model mix of SAC's batches, the checkpoint round trip through ``polar run``/resume, and bad input."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.algorithms.mbpo import MBPOLearner, check_mbpo_spaces, termination_rule
from polar.buffers.mixed import MixedReplay
from polar.buffers.replay_buffer import ReplayBuffer
from polar.config.base import validate
from polar.config.mbpo import MBPOKwargs
from polar.config.run import RunConfig
from polar.errors import ConfigError
from polar.metrics.logger import read_metrics
from polar.models.off_policy import QCritic, SquashedGaussianAgent
from polar.trainers.build import compose
from polar.trainers.checkpoint import load_checkpoint
from polar.trainers.run_dir import RunDir
from polar.types import Batch, Replay

OBS = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
A = np.array([[0.9, 0.1, 0.0], [0.0, 0.8, 0.2], [0.1, 0.0, 0.7]], np.float32)
B = np.array([[0.5, 0.0], [0.0, 0.3], [0.2, 0.2]], np.float32)
C = np.array([1.0, -0.5, 0.25], np.float32)


def linear_replay(n: int, seed: int = 0, terminal: float | None = None) -> ReplayBuffer:
    """``n`` transitions of s' = A s + B a + noise, r = C . s; terminal where s'[0] > ``terminal``."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    act = rng.uniform(-1, 1, size=(n, 2)).astype(np.float32)
    nxt = (obs @ A.T + act @ B.T + 0.01 * rng.normal(size=(n, 3))).astype(np.float32)
    done = (nxt[:, 0] > terminal).astype(np.float32) if terminal is not None else np.zeros(n, np.float32)
    buf = ReplayBuffer(n, OBS, ACT, seed=seed)
    buf.add(obs, act, (obs @ C).astype(np.float32), nxt, done)
    return buf


def learner(tmp_path: Path, **kw) -> MBPOLearner:
    torch.manual_seed(0)
    kwargs = MBPOKwargs(**{"ensemble_size": 4, "num_elites": 2, "model_hidden_sizes": [64, 64],
                           "model_max_epochs": 30, "rollout_batch_size": 64, "batch_size": 32, "learning_starts": 0,
                           "termination": "never", **kw})
    agent = SquashedGaussianAgent(OBS, ACT, [32, 32], "relu", [])
    return MBPOLearner(agent, kwargs, lambda: QCritic(OBS, ACT, [32, 32], "relu", []), OBS, ACT, 10_000,
                       ReplayBuffer(kwargs.model_buffer_size, OBS, ACT, seed=1), MixedReplay, tmp_path)


def holdout_nll(lrn: MBPOLearner, buf: ReplayBuffer) -> float:
    from polar.algorithms.mbpo import gaussian_nll

    data = buf.take(np.arange(len(buf)))
    with torch.no_grad():
        mean, log_std = lrn.model(torch.cat([data.obs, data.actions], -1))
        target = torch.cat([data.next_obs - data.obs, data.rewards.unsqueeze(-1)], -1)
        return float(gaussian_nll(mean, log_std, target).mean())


def test_the_ensemble_nll_falls_and_its_elites_predict_a_known_linear_system(tmp_path):
    lrn = learner(tmp_path)
    train, test = linear_replay(1000, seed=0), linear_replay(500, seed=1)
    before = holdout_nll(lrn, test)
    stats = lrn.fit_model(train)
    after = holdout_nll(lrn, test)
    assert after < before - 3.0, (before, after)  # NLL per dim: a wide guess to a confident, right one
    assert stats["model/holdout_mse"] < 0.01 and stats["model/epochs"] >= 2
    assert len(set(lrn.elites.tolist())) == len(lrn.elites) == 2
    obs = torch.tensor([[1.0, 0.5, -0.5]])
    act = torch.tensor([[0.5, -0.5]])
    nxt, rew = lrn.predict(obs, act)
    expected = obs.numpy() @ A.T + act.numpy() @ B.T
    assert np.allclose(nxt.numpy(), expected, atol=0.15) and abs(float(rew[0]) - float((obs.numpy() @ C)[0])) < 0.15
    # the learned log-std bounds moved and the predicted std sits inside them
    assert float(lrn.model.max_log_std.detach().mean()) < 0.25
    _, log_std = lrn.model(torch.cat([obs, act], -1))
    assert bool((log_std <= lrn.model.max_log_std + 1e-5).all() and (log_std >= lrn.model.min_log_std - 1e-5).all())


def test_rollouts_branch_from_real_states_for_k_steps(tmp_path):
    lrn = learner(tmp_path)
    real = linear_replay(500)
    lrn.fit_model(real)
    stats = lrn.rollout(real, 3)
    assert stats["rollout/steps"] == 3 and stats["rollout/added"] == 3 * 64 == len(lrn.model_replay)
    model = lrn.model_replay.take(np.arange(len(lrn.model_replay)))
    real_obs = {tuple(np.round(o, 5)) for o in real.take(np.arange(len(real))).obs.numpy()}
    first, later = model.obs[:64].numpy(), model.obs[64:].numpy()
    assert all(tuple(np.round(o, 5)) in real_obs for o in first)  # branched from real states
    assert not any(tuple(np.round(o, 5)) in real_obs for o in later)  # then the model's own
    assert torch.equal(model.obs[64:128], model.next_obs[:64])  # each step continues the previous one
    assert float(model.terminated.sum()) == 0 and bool((model.actions.abs() <= 1).all())


def test_a_rollout_stops_the_branches_that_terminate(tmp_path):
    lrn = learner(tmp_path)
    lrn.rule = lambda o: o[:, 0] > 0.0  # a rule as termination: env gives one
    real = linear_replay(500)
    lrn.fit_model(real)
    stats = lrn.rollout(real, 4)
    model = lrn.model_replay.take(np.arange(len(lrn.model_replay)))
    assert stats["rollout/terminated"] == int(model.terminated.sum()) > 0
    assert bool((model.terminated == (model.next_obs[:, 0] > 0).float()).all())
    assert stats["rollout/added"] < 4 * 64  # ended branches do not continue


def test_the_rollout_length_schedule(tmp_path):
    kw = MBPOKwargs(rollout_length=(1000, 3000, 1, 5))
    assert [kw.rollout_length_at(s) for s in (0, 1000, 2000, 3000, 9000)] == [1, 1, 3, 5, 5]
    assert kw.model_buffer_size == kw.rollout_batch_size * 5 * kw.model_retain_rounds
    assert MBPOKwargs(rollout_length=2).rollout_length_at(10**6) == 2


def test_a_learned_termination_separates_terminal_next_states(tmp_path):
    lrn = learner(tmp_path, termination="learned")
    lrn.fit_model(linear_replay(3000, terminal=1.0))  # about 15% terminal
    rng = np.random.default_rng(5)
    states = torch.tensor(rng.normal(size=(2000, 3)), dtype=torch.float32)
    predicted = lrn.terminated(states).numpy()
    truth = states[:, 0].numpy() > 1.0
    assert (predicted == truth).mean() > 0.95 and predicted[truth].mean() > 0.8


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Walker2d-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5"])
def test_the_env_termination_rules_agree_with_the_real_envs(env_id):
    rule = termination_rule(env_id, {})
    env = gym.make(env_id)
    got, want = [], []
    obs, _ = env.reset(seed=0)
    for t in range(600):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        got.append(bool(rule(obs[None])[0]))
        want.append(bool(terminated))
        if terminated or truncated:
            obs, _ = env.reset(seed=t)
    env.close()
    assert got == want and any(want)


def test_mixed_batches_draw_real_ratio_from_the_real_buffer(tmp_path):
    lrn = learner(tmp_path, real_ratio=0.25, batch_size=64, gradient_steps=3)
    real = linear_replay(500)
    out = lrn.update(Batch(Replay(real, 1), env_steps=1, run_env_steps=500))
    assert out["model/fits"] == 1 and out["rollout/added"] == 64 and out["n_updates"] == 3
    assert out["real_fraction"] == 16 / 64
    seen = []
    sample = lrn.mixed.sample
    lrn.mixed.sample = lambda n, beta=None: seen.append(sample(n)) or seen[-1]
    lrn.sac.train(lrn.mixed, 1, 501)
    batch = seen[0]
    # the linear system's rewards are C . s exactly; the model's are close but never equal
    exact = torch.isclose(batch.rewards, batch.obs @ torch.tensor(C), atol=1e-6)
    assert int(exact.sum()) == 16


def test_model_fits_wait_for_learning_starts_and_model_train_freq(tmp_path):
    lrn = learner(tmp_path, learning_starts=300, model_train_freq=100, gradient_steps=1, model_max_epochs=1)
    real = linear_replay(500)
    fits = []
    for steps in range(100, 600, 50):
        lrn.update(Batch(Replay(real, 50), env_steps=50, run_env_steps=steps))
        fits.append(lrn.fits)
    assert fits == [0, 0, 0, 0, 1, 1, 2, 2, 3, 3]  # at 300, 400, 500


@pytest.mark.parametrize("kwargs, words", [
    ({"num_elites": 6}, "num_elites"),
    ({"rollout_length": [5, 1, 1, 3]}, "from_env_steps"),
    ({"n_step_return": 3}, "n_step_return"),
    ({"n_steps": 3}, "rollout_length"),
    ({"real_ratio": 1.0}, "real_ratio"),
    ({"termination": "sometimes"}, "termination"),
])
def test_bad_kwargs_are_config_errors_naming_the_key(kwargs, words, tmp_path):
    with pytest.raises((ConfigError, ValueError)) as err:
        validate(RunConfig, run_config(**kwargs))
    assert words in str(err.value)


def test_termination_env_names_the_envs_it_knows():
    with pytest.raises(ConfigError, match=r"HalfCheetah.*Hopper.*not of harness 'CartPole-v1'"):
        termination_rule("CartPole-v1", {})
    with pytest.raises(ConfigError, match="healthy_z_range; use termination: learned"):
        termination_rule("Hopper-v5", {"healthy_z_range": [0.5, 2.0]})
    assert termination_rule("Pendulum-v1", {"g": 9.0})(np.zeros((2, 3))).tolist() == [False, False]


def run_config(env_id: str = "Pendulum-v1", total: int = 600, **kwargs) -> dict:
    return {
        "name": "mbpo-test", "seed": 0, "harness": {"type": "gymnasium", "id": env_id},
        "agent": {"type": "mlp", "hidden_sizes": [32, 32]},
        "policy": {"type": "mbpo", "kwargs": {
            "learning_starts": 200, "batch_size": 32, "gradient_steps": 1, "ensemble_size": 3, "num_elites": 2,
            "model_hidden_sizes": [32], "model_max_epochs": 3, "model_train_freq": 200, "rollout_batch_size": 50,
            "termination": "learned", **kwargs}},
        "distribution": {"rollout_workers": 0, "envs_per_worker": 1},
        "total_env_steps": total,
        "logging": {"tensorboard": False, "checkpoint_freq": 1, "progress_bar": False, "keep_checkpoints": 1},
        "eval": {"at_end": False, "episodes": 1, "num_envs": 1},
    }


def train(cfg, path: Path, resume: bool = False):
    run = RunDir.open(path) if resume else RunDir.create(cfg.name, path)
    loop = compose(cfg, run, resume=resume)
    return loop.train(), loop


def test_a_run_checkpoints_models_normalisers_and_both_buffers_and_resumes_them(tmp_path):
    path = tmp_path / "run"
    cfg = validate(RunConfig, run_config(total=1000))
    result, first = train(cfg, path)
    assert result["env_steps"] == 1000
    rows = read_metrics(path / "metrics.jsonl")
    last = rows[-1]
    # 5 rounds of 50 branches; the buffer keeps the last model_retain_rounds (4)
    assert last["model/fits"] == 5 and last["model_replay_size"] == 4 * 50 and 0 < last["real_fraction"] < 0.1
    ckpt = sorted((path / "checkpoints").glob("ckpt_*.pt"))[-1]
    state = load_checkpoint(ckpt)
    assert state["learner"]["model_replay_file"] == f"model_replay_{ckpt.stem.split('_')[1]}.npz"
    assert sorted(p.name for p in (path / "checkpoints").glob("*.npz")) == [
        f"model_replay_{ckpt.stem.split('_')[1]}.npz", f"replay_{ckpt.stem.split('_')[1]}.npz"]  # pruned with it

    saved = first.learner.algorithm
    again = compose(cfg.model_copy(update={"total_env_steps": 2000}), RunDir.open(path), resume=True)
    again.restore()
    try:
        loaded = again.learner.algorithm
        for k, v in saved.model.state_dict().items():  # weights, log-std bounds, the input normaliser
            assert torch.equal(loaded.model.state_dict()[k], v), k
        assert torch.equal(loaded.model.input_std, saved.model.input_std) and float(saved.model.input_std[0]) != 1.0
        for k, v in saved.classifier.state_dict().items():
            assert torch.equal(loaded.classifier.state_dict()[k], v), k
        assert torch.equal(loaded.elites, saved.elites) and loaded.last_fit == saved.last_fit == 1000
        assert loaded.fits == 5 and loaded.sac.n_updates == saved.sac.n_updates > 0
        a = saved.model_replay.take(np.arange(len(saved.model_replay)))
        b = loaded.model_replay.take(np.arange(len(loaded.model_replay)))
        assert len(loaded.model_replay) == 200 and torch.equal(a.obs, b.obs) and torch.equal(a.rewards, b.rewards)
        assert loaded.model_replay.rng.bit_generator.state == saved.model_replay.rng.bit_generator.state
        assert len(again.collector.replay) == 1000
        assert loaded.model_optimizer.state_dict()["state"][0]["step"] == saved.model_optimizer.state_dict()["state"][0]["step"]
    finally:
        again.collector.close()
    result, resumed = train(cfg.model_copy(update={"total_env_steps": 2000}), path, resume=True)
    assert result["env_steps"] == 2000 and resumed.learner.algorithm.fits == 10  # at 1200, 1400, ..., 2000


def test_spaces_mbpo_cannot_model_are_config_errors(tmp_path):
    cfg = validate(RunConfig, run_config("CartPole-v1"))
    with pytest.raises(ConfigError, match="needs a Box"):
        compose(cfg, RunDir.create("bad", tmp_path / "run")).train()
    dict_obs = gym.spaces.Dict({"x": OBS})
    with pytest.raises(ConfigError, match=r"flat \(1-D\) Box observations; this env's are Dict.*policy.type: sac"):
        check_mbpo_spaces(dict_obs, ACT)
    with pytest.raises(ConfigError, match="flat"):
        check_mbpo_spaces(gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), ACT)


@pytest.mark.parametrize("section, words", [
    ({"replay_mix": {"dataset": "d-v0"}}, "replay_mix: mixes an old dataset into the batches of dqn or sac; "
                                          "policy.type 'mbpo' is neither"),
    ({"init": {"source": "runs/old"}}, "init: starts an online run (ppo, appo, dqn, sac) from earlier weights; "
                                    "policy.type 'mbpo' is none of those"),
])
def test_continual_sections_are_refused_naming_mbpo(section, words):
    with pytest.raises((ConfigError, ValueError)) as err:
        validate(RunConfig, {**run_config(), **section})
    assert words in str(err.value)


def test_resume_refuses_a_missing_model_buffer_or_classifier_naming_them(tmp_path):
    from polar.errors import CheckpointError

    saved = learner(tmp_path)  # termination never: no classifier
    state = {**saved.state_dict(), "model_replay_file": "model_replay_00000002.npz"}
    with pytest.raises(CheckpointError, match=r"model_replay_00000002\.npz, which is missing"):
        learner(tmp_path).load_state_dict(state)
    with pytest.raises(CheckpointError, match="no termination classifier"):
        learner(tmp_path, termination="learned").load_state_dict(state)


def test_a_side_file_one_section_down_is_written_beside_its_checkpoint_and_pruned_with_it(tmp_path):
    from polar.trainers.checkpoint import CheckpointManager
    from polar.types import SideFile

    written: list[str] = []

    def write(path: Path) -> None:
        path.write_bytes(b"buffer")
        written.append(path.name)

    manager = CheckpointManager(tmp_path, keep=1)
    manager.save(1, {"learner": {"model_replay_file": SideFile("model_replay", "npz", write), "fits": 1}})
    state = load_checkpoint(tmp_path / "ckpt_00000001.pt")
    assert state["learner"] == {"model_replay_file": "model_replay_00000001.npz", "fits": 1} and written == [
        "model_replay_00000001.npz"]
    manager.save(2, {"learner": {"model_replay_file": SideFile("model_replay", "npz", write)}})
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["model_replay_00000002.npz"]
