"""BC and IQL through the one loop: from a dataset only, evaluated on the env; ``polar collect`` writes datasets.

What is measured: the deterministic evaluation return (10 episodes) on CartPole-v1 (500 = perfect, a uniform
random policy gets ~22). The expert dataset is a scripted controller that balances for 500 steps."""

from __future__ import annotations

import json

import pytest

from polar.trainers.build import build_trainer, create_run_dir
from tests.datasets.offline_data import cartpole_expert, offline_config, play, write

FAST = {"batch_size": 64}
IQL_FAST = {"batch_size": 64, "critic_hidden": [64, 64]}


def train(cfg, path):
    return build_trainer(cfg, create_run_dir(cfg, path)).train()


def test_bc_and_iql_learn_cartpole_from_expert_data(tmp_path):
    ds = write(tmp_path / "cartpole-expert-v0", "CartPole-v1", play("CartPole-v1", 4, cartpole_expert, max_steps=200))
    bc = train(offline_config("CartPole-v1", "bc", ds, 1000, **FAST), tmp_path / "bc")
    assert bc["env_steps"] == 0 and bc["iterations"] == 2  # no env interaction: 1000 steps in iterations of 500
    assert bc["eval"]["return_mean"] >= 150, bc["eval"]
    iql = train(offline_config("CartPole-v1", "iql", ds, 1000, **IQL_FAST), tmp_path / "iql")
    assert iql["eval"]["return_mean"] >= 150, iql["eval"]
    rows = [json.loads(line) for line in (tmp_path / "iql" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["n_updates"] == 1000 and rows[-1]["dataset/transitions"] == 800
    assert all(k in rows[-1] for k in ("value_loss", "critic_loss", "actor_loss"))


def test_iql_continuous_runs_on_pendulum(tmp_path):
    ds = write(tmp_path / "pendulum-random-v0", "Pendulum-v1", play("Pendulum-v1", 4, None, max_steps=100))
    res = train(offline_config("Pendulum-v1", "iql", ds, 200, **IQL_FAST), tmp_path / "iql")
    assert res["eval"]["gradient_steps"] == 200 and res["eval"]["episodes"] == 10


def test_a_dataset_of_another_env_fails_before_training(tmp_path):
    from polar.errors import ConfigError

    ds = write(tmp_path / "pendulum-random-v0", "Pendulum-v1", play("Pendulum-v1", 1, None, max_steps=10))
    with pytest.raises(ConfigError, match=r"policy.kwargs.dataset: the dataset's observation_space is Box.*CartPole|env's"):
        train(offline_config("CartPole-v1", "bc", ds, 10), tmp_path / "bc")


def test_polar_collect_writes_a_dataset_bc_trains_on(tmp_path):
    from polar.cli.main import main
    from polar.config import RunConfig, validate

    cfg = validate(RunConfig, {"name": "ppo-src", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
                               "policy": {"type": "ppo", "kwargs": {"n_steps": 32, "batch_size": 32}},
                               "distribution": {"backend": "local"}, "total_env_steps": 64,
                               "logging": {"tensorboard": False, "progress_bar": False}, "eval": {"at_end": False}})
    train(cfg, tmp_path / "src")
    out = tmp_path / "cartpole-ppo-v0"
    assert main(["collect", str(tmp_path / "src"), "--episodes", "3", "--out", str(out), "--epsilon", "0.1"]) == 0
    meta = json.loads((out / "data" / "metadata.json").read_text())
    assert meta["total_episodes"] == 3 and meta["algorithm_id"] == "polar-ppo"
    minari = pytest.importorskip("minari")
    assert minari.MinariDataset(out / "data").total_steps == meta["total_steps"]
    assert main(["collect", str(tmp_path / "src"), "--episodes", "1", "--out", str(out)]) == 1  # exists: refused
    res = train(offline_config("CartPole-v1", "bc", out, 20, **FAST), tmp_path / "bc")
    assert res["eval"]["gradient_steps"] == 20


@pytest.mark.slow
def test_iql_beats_bc_on_expert_plus_adversarial_data(tmp_path):
    """5 expert episodes (200 steps each) and 60 of the anti-controller (it pushes the wrong way: ~9 steps each)
    around the same start states. BC copies both and falls early (measured: 11.4 and 12.8 over seeds 0 and 1);
    IQL's advantage weights prefer the expert's actions where both appear (measured: 23.4 and 69.2). Both are far
    from the expert's 200: this shows the direction, not a solved task."""
    good = play("CartPole-v1", 5, cartpole_expert, max_steps=200)
    bad = play("CartPole-v1", 60, lambda o: 1 - cartpole_expert(o), seed=100, max_steps=200)
    ds = write(tmp_path / "cartpole-mixed-v0", "CartPole-v1", good + bad)
    bc = train(offline_config("CartPole-v1", "bc", ds, 2000, **FAST), tmp_path / "bc")["eval"]["return_mean"]
    iql = train(offline_config("CartPole-v1", "iql", ds, 3000, gamma=0.9, tau=0.05, **IQL_FAST),
                tmp_path / "iql")["eval"]["return_mean"]
    assert iql > bc, (iql, bc)


def test_offline_runs_are_composed_from_the_loop_seams(tmp_path):
    from polar.algorithms.bc import BCLearner
    from polar.rollout.dataset import DatasetCollector
    from polar.trainers.build import run_kind
    from polar.trainers.env_run import PolicyLearner
    from polar.trainers.loop import TrainingLoop
    from polar.types import Collector, Learner

    assert issubclass(PolicyLearner, Learner) and issubclass(DatasetCollector, Collector)
    ds = write(tmp_path / "cartpole-expert-v0", "CartPole-v1", play("CartPole-v1", 1, cartpole_expert, max_steps=20))
    cfg = offline_config("CartPole-v1", "bc", ds, 10)
    assert run_kind(cfg) == "env"
    loop = build_trainer(cfg, create_run_dir(cfg, tmp_path / "r"))
    assert type(loop) is TrainingLoop and type(loop.collector) is DatasetCollector
    assert type(loop.learner) is PolicyLearner and type(loop.learner.algorithm) is BCLearner


def test_an_offline_run_on_ray_is_refused_before_any_cluster(tmp_path):
    from polar.errors import ConfigError

    cfg = offline_config("CartPole-v1", "iql", tmp_path / "none-v0")
    ray = cfg.model_copy(update={"distribution": cfg.distribution.model_copy(update={"backend": "ray"})})
    with pytest.raises(ConfigError, match=r"policy.type 'iql' trains from a dataset in this process; set "
                                          r"distribution.backend: local"):
        build_trainer(ray, create_run_dir(ray, tmp_path / "r"))
