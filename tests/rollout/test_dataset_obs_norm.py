"""``policy.kwargs.normalize_obs`` on offline runs: observations standardised by the dataset's mean/std through
polar's one ``ObsNormalizer``, set once from the dataset, frozen, saved with the checkpoint (so ``polar eval``,
``export`` and ``serve`` apply them); off, nothing changes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.config import RunConfig, validate
from polar.datasets.minari import load_dataset
from polar.errors import ConfigError
from polar.trainers.build import build_trainer, create_run_dir
from polar.trainers.loading import load_policy_for_eval
from tests.datasets.offline_data import cartpole_expert, offline_config, play, write

TINY = {"batch_size": 32, "steps_per_iteration": 10}
CRITIC = {"critic_hidden": [32, 32]}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("obsnorm")
    # CartPole's velocities are far from (0, 1): the statistics are not the identity
    return write(root / "cartpole-mixed-v0", "CartPole-v1", play("CartPole-v1", 4, cartpole_expert, epsilon=0.3,
                                                                 max_steps=100))


def config(dataset, algo: str, steps: int = 20, **kw) -> RunConfig:
    extra = {**TINY, **(CRITIC if algo == "iql" else {}), **kw}
    cfg = offline_config("CartPole-v1", algo, dataset, steps, **extra)
    return validate(RunConfig, {**cfg.model_dump(), "eval": {"episodes": 2, "num_envs": 1}})


def run(cfg, path):
    trainer = build_trainer(cfg, create_run_dir(cfg, path))
    return trainer, trainer.train()


def obs_batch(dataset) -> torch.Tensor:
    data = load_dataset(str(dataset), None, gym.make("CartPole-v1").observation_space,
                        gym.spaces.Discrete(2), where="test")
    return torch.as_tensor(data.obs[:64])


@pytest.mark.parametrize("algo", ["bc", "iql", "cql"])
def test_the_statistics_are_the_datasets_frozen_and_checkpointed(dataset, tmp_path, algo):
    env = gym.make("CartPole-v1")
    data = load_dataset(str(dataset), None, env.observation_space, env.action_space, where="test")
    x = data.obs.astype(np.float64)
    trainer, result = run(config(dataset, algo, normalize_obs=True), tmp_path / algo)
    assert result["eval"]["episodes"] == 2  # evaluation ran env steps through the policy...
    norm = trainer.learner.parts.policy.obs_norm.norm
    # ...and the statistics are still exactly the dataset's: nothing folded the env's observations in
    np.testing.assert_allclose(norm.mean.numpy(), x.mean(0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(norm.var.sqrt().numpy(), x.std(0), rtol=0, atol=1e-12)
    assert float(norm.count) == len(data)
    assert np.abs(x.std(0) - 1).min() > 0.3  # far from the identity: standardising changes every input
    # the learner was fed standardised observations (the normaliser's own forward, clipped at clip_obs)
    fed = trainer.collector.tensors["obs"]
    want = np.clip((x - x.mean(0)) / np.sqrt(x.var(0) + 1e-8), -10, 10)
    np.testing.assert_allclose(fed.numpy(), want, atol=1e-5)
    np.testing.assert_allclose(trainer.collector.tensors["next_obs"].numpy(),
                               np.clip((data.next_obs - x.mean(0)) / np.sqrt(x.var(0) + 1e-8), -10, 10), atol=1e-5)

    # the checkpoint carries them; the policy polar eval / export / serve load acts as the in-memory one
    _, _, loaded, _, state = load_policy_for_eval(trainer.run_dir.path)
    assert any(k.startswith("obs_norm.") for k in state["policy"])
    for k in ("mean", "var", "count"):
        assert torch.equal(getattr(loaded.obs_norm.norm, k), getattr(norm, k))
    obs = obs_batch(dataset)
    trainer.learner.parts.policy.eval()
    with torch.no_grad():
        a_mem, _, info_mem = trainer.learner.parts.policy.act(obs, None, True)
        a_ckpt, _, info_ckpt = loaded.act(obs, None, True)
        _, _, info_raw = loaded.agent.act(obs, None, True)  # what a loader ignoring the statistics would do
    assert torch.equal(a_mem, a_ckpt)
    key = "q_values" if "q_values" in info_mem else "logits"
    assert torch.equal(info_mem[key], info_ckpt[key])
    assert (info_raw[key] - info_ckpt[key]).abs().max() > 1e-4


def test_off_is_the_raw_pipeline_bit_for_bit(dataset, tmp_path):
    default = config(dataset, "iql")
    assert default.policy.kwargs.normalize_obs is False
    t_default, r_default = run(default, tmp_path / "default")
    t_off, r_off = run(config(dataset, "iql", normalize_obs=False), tmp_path / "off")
    assert t_default.learner.parts.policy.obs_norm is None
    assert not any(k.startswith("obs_norm.") for k in t_default.learner.parts.policy.state_dict())
    env = gym.make("CartPole-v1")
    data = load_dataset(str(dataset), None, env.observation_space, env.action_space, where="test")
    assert torch.equal(t_default.collector.tensors["obs"], torch.as_tensor(data.obs))  # raw, the very values
    sd_default, sd_off = t_default.learner.parts.policy.state_dict(), t_off.learner.parts.policy.state_dict()
    assert sd_default.keys() == sd_off.keys() and all(torch.equal(sd_default[k], sd_off[k]) for k in sd_default)
    assert r_default["eval"]["return_mean"] == r_off["eval"]["return_mean"]
    # and on: other inputs, so other weights from the same seed
    t_on, _ = run(config(dataset, "iql", normalize_obs=True), tmp_path / "on")
    on_params, default_params = t_on.learner.parts.policy.agent.parameters(), t_default.learner.parts.policy.agent.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(on_params, default_params, strict=True))


def test_observations_it_cannot_standardise_are_refused():
    from polar.datasets.minari import Transitions
    from polar.models.normalization import ObsNormalizer
    from polar.rollout.dataset import set_dataset_statistics

    image = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    data = Transitions("x", image, gym.spaces.Discrete(2), np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4),
                       np.zeros(4), np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4), [0.0])
    with pytest.raises(ConfigError, match=r"normalize_obs.*set policy.kwargs.normalize_obs: false"):
        set_dataset_statistics(ObsNormalizer(image, 10.0), data, image, "bc")


def test_the_option_is_refused_where_it_has_no_meaning():
    base = {"name": "x", "harness": {"type": "gymnasium", "id": "CartPole-v1"}, "distribution": {"backend": "local"}}
    with pytest.raises(Exception, match="normalize_obs"):  # DQN has no normaliser: an unknown key
        validate(RunConfig, {**base, "policy": {"type": "dqn", "kwargs": {"normalize_obs": True}}})


def test_a_normalised_cql_source_is_refused_for_dqn(dataset, tmp_path):
    trainer, _ = run(config(dataset, "cql", normalize_obs=True), tmp_path / "cql")
    cfg = validate(RunConfig, {
        "name": "online", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "agent": {"type": "mlp", "hidden_sizes": [64, 64]}, "policy": {"type": "dqn"},
        "init": {"source": str(trainer.run_dir.path)}, "total_env_steps": 64,
        "logging": {"tensorboard": False, "progress_bar": False}, "distribution": {"backend": "local"}})
    with pytest.raises(ConfigError, match=r"normalises observations.*dqn has no observation normaliser"):
        build_trainer(cfg, create_run_dir(cfg, tmp_path / "dqn")).train()
