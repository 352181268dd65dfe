"""Does it learn through the Ray backend (learner actor + rollout actors), and does it survive losing
rollout actors, the learner, a node, and the driver? Does the autoscaling rule resize a running run?

Runs on local multi-node clusters (``ray.cluster_utils.Cluster``). These are long learning runs on a
2-core machine, so they are ``slow``; the contract tests in test_ray_backend.py and test_learner_actor.py
stay in the default suite.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from polar.config import RunConfig, validate
from polar.metrics.logger import read_metrics
from polar.trainers.build import build_trainer
from polar.trainers.run_dir import RunDir

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PPO_ZOO = {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0,
           "learning_rate": 1e-3, "lr_schedule": "linear", "clip_range_schedule": "linear"}
APPO = {"n_steps": 64, "learning_rate": 1e-3, "n_epochs": 2, "batch_size": 256}


def run_cfg(address, policy, workers=2, envs=4, total=300_000, checkpoint_freq=0, dist=None, **extra):
    return validate(RunConfig, {
        "name": "ray-test",
        "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "policy": policy,
        "distribution": {"backend": "ray", "coordinator_address": address, "rollout_workers": workers,
                         "envs_per_worker": envs, "rollout_resources": {"num_cpus": 1}, **(dist or {})},
        "total_env_steps": total,
        "stop_reward": 475,
        "logging": {"checkpoint_freq": checkpoint_freq, "tensorboard": False, "progress_bar": False},
        "eval": {"episodes": 5, "num_envs": 5},
        **extra,
    })


def assert_learner_was_an_actor(run: RunDir):
    import ray

    learner = run.read_meta()["learner"]
    assert learner["pid"] != os.getpid() and learner["driver_pid"] == os.getpid()
    assert learner["node_id"] in {n["NodeID"] for n in ray.nodes()}
    return learner


def test_appo_learns_cartpole_on_ray(ray_cluster, tmp_path):
    # steps to 475 vary 220k-400k over seeds/timing (the same with the learner in the driver): a 600k cap
    cfg = run_cfg(ray_cluster.address, {"type": "appo", "kwargs": APPO}, total=600_000)
    run = RunDir.create("appo", tmp_path / "run")
    rows = []
    result = build_trainer(cfg, run, on_iteration=rows.append).train()
    why = {k: v for k, v in rows[-1].items() if k.startswith(("rollout/", "learner/", "episode_", "stale"))}
    assert result["stopped_early"] and result["episode_reward_mean"] >= 475, (result, why)
    assert result["eval"]["return_mean"] >= 400, (result["eval"], why)
    assert_learner_was_an_actor(run)


@pytest.fixture
def fragile_cluster():
    """Its own cluster: a head that holds the learner (custom resource ``learner_box``) and one worker node
    this test may kill."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    args = {"num_cpus": 2, "object_store_memory": 150 * 1024**2}
    cluster = Cluster(initialize_head=True,
                      head_node_args={**args, "include_dashboard": False, "resources": {"learner_box": 1}})
    worker = cluster.add_node(**args)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_ppo_learns_through_a_killed_actor_and_a_killed_node(fragile_cluster, tmp_path):
    import ray

    cluster, worker_node = fragile_cluster
    # the learner (1 CPU) is pinned to the head; 3 rollout actors x 1 CPU: two live on the node we kill
    cfg = run_cfg(cluster.address, {"type": "ppo", "kwargs": PPO_ZOO}, workers=3, envs=3,
                  dist={"learner_resources": {"num_cpus": 1, "resources": {"learner_box": 1}}})
    events = {}
    driver = None

    def chaos(metrics):
        if metrics["iteration"] == 5:
            wid, actor = next(iter(driver.rollout_actors().items()))
            ray.kill(actor, no_restart=True)
            events["killed_actor"] = wid
        if metrics["iteration"] == 25:
            on_node = [w for w, a in driver.rollout_actors().items()
                       if ray.get(a.ready.remote(), timeout=30)["node_id"] == worker_node.node_id]
            assert on_node, "expected a rollout actor on the worker node"
            events["actors_on_node"] = len(on_node)
            cluster.remove_node(worker_node, allow_graceful=False)
        events["last"] = metrics

    run = RunDir.create("ppo", tmp_path / "run")
    driver = build_trainer(cfg, run, on_iteration=chaos)
    result = driver.train()
    last = events["last"]
    assert result["stopped_early"] and result["episode_reward_mean"] >= 475
    # one restart for the killed actor, one per actor lost with its node; each lost fragment counted
    assert last["rollout/restarts"] >= 1 + events["actors_on_node"]
    assert last["rollout/dropped_fragments"] == last["rollout/restarts"]
    assert last["rollout/dropped_episodes"] == 3 * last["rollout/restarts"]
    # the learner lived on the head the whole time
    assert result["learner_restarts"] == 0 and last["learner/restarts"] == 0
    assert assert_learner_was_an_actor(run)["node_id"] != worker_node.node_id


def test_killed_learner_restarts_from_the_last_checkpoint_and_reaches_the_target(ray_cluster, tmp_path):
    import ray

    from polar.distributed.control import request_scale

    cfg = run_cfg(ray_cluster.address, {"type": "ppo", "kwargs": PPO_ZOO}, checkpoint_freq=5)
    run = RunDir.create("ppo", tmp_path / "run")
    seen = []
    killed = []
    driver = None

    def kill_learner_once(metrics):
        seen.append(metrics)
        if metrics["iteration"] == 6 and not killed:
            request_scale(run.path, 3)  # the new learner must keep this count
        if metrics["iteration"] >= 12 and metrics["rollout/workers"] == 3 and not killed:
            killed.append(driver.learner_info["actor_id"])
            ray.kill(driver.actor, no_restart=True)

    driver = build_trainer(cfg, run, on_iteration=kill_learner_once)
    result = driver.train()
    assert result["stopped_early"] and result["episode_reward_mean"] >= 475
    assert result["learner_restarts"] == 1 and seen[-1]["learner/restarts"] == 1
    meta = run.read_meta()
    first, second = meta["learner_history"]
    assert first["actor_id"] == killed[0] != second["actor_id"] and second["resumed"] and second["restarts"] == 1
    assert meta["learner_restarts"] == 1
    # the second learner went on from a checkpoint (every 5 iterations, at least the 10th), not from scratch
    rows = read_metrics(run.metrics_path)
    restart_at = next(i for i, r in enumerate(rows) if r["learner/restarts"] == 1)
    resumed_from = rows[restart_at]["iteration"] - 1
    assert resumed_from >= 10 and resumed_from % 5 == 0
    assert rows[restart_at - 1]["iteration"] >= resumed_from  # a checkpoint the first learner had reached
    assert all(r["learner/restarts"] == 0 for r in rows[:restart_at])
    assert all(r["learner/restarts"] == 1 for r in rows[restart_at:])
    assert rows[restart_at]["rollout/target_workers"] == 3 and rows[-1]["rollout/workers"] == 3


def test_losing_the_learners_node_restarts_the_learner_on_another_node(tmp_path):
    """The learner is pinned (custom resource) to a node that dies; a replacement node joins, the driver
    starts a new learner there from the last checkpoint, and the run still reaches the target."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    args = {"num_cpus": 2, "object_store_memory": 150 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={**args, "include_dashboard": False})
    doomed = cluster.add_node(**args, resources={"learner_box": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        cfg = run_cfg(cluster.address, {"type": "ppo", "kwargs": PPO_ZOO}, checkpoint_freq=5,
                      dist={"learner_resources": {"num_cpus": 1, "resources": {"learner_box": 1}}})
        run = RunDir.create("ppo", tmp_path / "run")
        replacement = []
        rows = []

        def lose_the_learners_node(metrics):
            rows.append(metrics)
            if metrics["iteration"] == 12 and not replacement:
                cluster.remove_node(doomed, allow_graceful=False)
                replacement.append(cluster.add_node(**args, resources={"learner_box": 1}))

        result = build_trainer(cfg, run, on_iteration=lose_the_learners_node).train()
        assert result["stopped_early"] and result["episode_reward_mean"] >= 475
        assert result["learner_restarts"] == 1 and rows[-1]["learner/restarts"] == 1
        first, second = run.read_meta()["learner_history"]
        assert first["node_id"] == doomed.node_id and second["node_id"] == replacement[0].node_id
        assert second["resumed"]
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_driver_crash_then_resume_from_the_last_checkpoint(ray_cluster, tmp_path):
    """SIGKILL the driver (`polar run`) after its first checkpoint; `polar resume` goes on from there."""
    cfg_path = tmp_path / "ppo.yaml"
    cfg_path.write_text(
        "name: crash\nharness: {type: gymnasium, id: CartPole-v1}\n"
        f"policy: {{type: ppo, kwargs: {PPO_ZOO}}}\n".replace("'", "")
        + f"distribution: {{backend: ray, coordinator_address: '{ray_cluster.address}', rollout_workers: 2, "
        "envs_per_worker: 4, rollout_resources: {num_cpus: 1}}\n"
        "total_env_steps: 300000\nstop_reward: 475\n"
        "logging: {checkpoint_freq: 5, tensorboard: false, progress_bar: false}\neval: {episodes: 5, num_envs: 5}\n"
    )
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "polar.cli.main", "run", "-c", str(cfg_path), "--run-dir", str(run_dir),
                             "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpts = run_dir / "checkpoints"

    def newest_iteration() -> int:
        # any checkpoint from iteration 10 on: at thousands of fps the 10th is rotated out (keep_checkpoints)
        # between two polls, so looking for that one file alone can miss it
        return max((int(p.name.split(".")[0].split("_")[1]) for p in ckpts.glob("ckpt_*.pt")), default=-1)

    deadline = time.monotonic() + 300
    try:
        while not (ckpts.is_dir() and newest_iteration() >= 10):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    from polar.trainers.checkpoint import CheckpointManager
    from polar.trainers.loading import load_run

    saved = CheckpointManager(ckpts).load_latest()
    run, cfg = load_run(run_dir)
    result = build_trainer(cfg, run, resume=True).train()
    assert int(saved["iteration"]) >= 10
    assert result["iterations"] > int(saved["iteration"]) and result["env_steps"] > int(saved["env_steps"])
    assert result["stopped_early"] and result["episode_reward_mean"] >= 475
