"""The learner as a Ray actor: placed with learner_resources, refused at start when it cannot be, progress relayed."""

import os

import pytest

from polar.config import RunConfig, validate
from polar.errors import DistributedError
from polar.metrics.logger import read_metrics
from polar.trainers.build import build_trainer
from polar.trainers.loop import TrainingLoop
from polar.trainers.run_dir import RunDir

pytestmark = pytest.mark.ray


def cfg_for(address, **dist):
    return validate(RunConfig, {
        "name": "learner-actor",
        "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "policy": {"type": "appo", "kwargs": {"n_steps": 32, "n_epochs": 1, "batch_size": 64}},
        "distribution": {"backend": "ray", "coordinator_address": address, "rollout_workers": 1, "envs_per_worker": 2,
                         "rollout_resources": {"num_cpus": 0.5}, **dist},
        "total_env_steps": 2_000,
        "logging": {"checkpoint_freq": 5, "tensorboard": False, "progress_bar": False},
        "eval": {"at_end": False},
    })


def test_build_trainer_keeps_the_local_learner_in_process(tmp_path):
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"}})
    assert type(build_trainer(cfg, RunDir.create("x", tmp_path / "run"))) is TrainingLoop


@pytest.mark.parametrize("learner, match", [
    ({"num_cpus": 16}, r"distribution\.learner_resources: each learner actor asks for num_cpus=16"),
    ({"num_cpus": 1, "resources": {"learner_box": 1}}, r"learner_box=1, but no node"),
])
def test_unplaceable_learner_is_refused_at_start(ray_cluster, tmp_path, learner, match):
    cfg = cfg_for(ray_cluster.address, learner_resources=learner)
    with pytest.raises(DistributedError, match=match):
        build_trainer(cfg, RunDir.create("x", tmp_path / "run")).train()


def test_learner_runs_in_an_actor_and_the_driver_relays_its_progress(ray_cluster, tmp_path):
    import ray

    rows = []
    run = RunDir.create("x", tmp_path / "run")
    driver = build_trainer(cfg_for(ray_cluster.address), run, on_iteration=rows.append)
    result = driver.train()
    assert result["env_steps"] >= 2_000 and result["learner_restarts"] == 0
    # every iteration reached the driver's callback, in order, with per-role metrics
    assert [r["iteration"] for r in rows] == list(range(1, result["iterations"] + 1))
    last = rows[-1]
    for key in ("learner/samples_per_s", "learner/wait_fraction", "rollout/env_steps_per_s", "rollout/queue_depth",
                "rollout/policy_lag_mean", "rollout/restarts", "rollout/workers"):
        assert key in last, key
    assert last["learner/restarts"] == 0 and last["rollout/workers"] == 1
    # the learner was an actor: another process, on a node of the cluster; it wrote the run directory
    meta = run.read_meta()
    learner = meta["learner"]
    assert learner["pid"] != os.getpid() and learner["driver_pid"] == os.getpid()
    assert learner["node_id"] in {n["NodeID"] for n in ray.nodes()}
    assert meta["status"] == "finished" and meta["learner_restarts"] == 0
    assert [m["iteration"] for m in read_metrics(run.metrics_path)] == [r["iteration"] for r in rows]
    assert (run.checkpoints_dir / "LATEST").is_file()
    assert driver.actor is None  # killed at the end, with its rollout actors


def test_learner_that_cannot_see_the_run_dir_says_so(ray_cluster, tmp_path):
    import ray

    from polar.trainers.build import compose
    from polar.trainers.ray_driver import LearnerActor

    cfg = cfg_for(ray_cluster.address)
    actor = ray.remote(LearnerActor).options(num_cpus=0.5).remote(
        cfg.model_dump(mode="json"), None, str(tmp_path / "elsewhere"), False, compose)
    with pytest.raises(ray.exceptions.RayActorError, match="cannot see the run directory"):
        ray.get(actor.ready.remote(), timeout=120)


def test_learner_deaths_beyond_max_learner_restarts_fail_the_run_with_a_message(ray_cluster, tmp_path):
    import ray

    cfg = cfg_for(ray_cluster.address, max_learner_restarts=0)
    cfg = cfg.model_copy(update={"total_env_steps": 10**7})
    run = RunDir.create("x", tmp_path / "run")
    driver = None

    def kill(metrics):
        if metrics["iteration"] == 2:
            ray.kill(driver.actor, no_restart=True)

    driver = build_trainer(cfg, run, on_iteration=kill)
    with pytest.raises(DistributedError, match=r"max_learner_restarts=0.*polar resume"):
        driver.train()
    assert run.read_meta()["learner"]["restarts"] == 0 and len(run.read_meta()["learner_history"]) == 1
