"""Agent runs honour ``distribution``: with ``backend: ray`` the learner (GRPO through the one loop) is a Ray
actor placed by ``learner_resources``, the sessions spread over ``rollout_workers`` gateway nodes (each with
its own engine) placed by ``gateway_resources``, every new version reaches every node, and a killed Ray node's
sessions move to a survivor. A ``distribution`` key an agent run cannot honour fails at start, naming it.

The run: the calculator example agent (official openai SDK; ``agents_for_tests:calc_or_stall`` is its entry
point) on the calculator tasks of ``examples/agentic``, the tiny model, reward 1 when the last call's first
sampled token id is even (so GRPO groups carry signal and weights change every step)."""

import json
from pathlib import Path

import pytest

from polar.config import RunConfig, validate
from polar.errors import ConfigError
from polar.metrics.logger import read_metrics
from polar.trainers.build import build_trainer
from polar.trainers.run_dir import RunDir

AGENTIC_TESTS = Path(__file__).resolve().parents[1] / "agent_support"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agentic"


def agent_cfg(tmp_path, dist, total_steps=2, hang_s=0.0, **policy):
    tasks = [json.loads(line) for line in (EXAMPLES / "train.jsonl").read_text().splitlines()[:8]]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({**t, **({"hang_s": hang_s} if hang_s else {})}) + "\n" for t in tasks))
    cfg = validate(RunConfig, {
        "name": "ray-agent",
        "harness": {"type": "agent", "callable": "agents_for_tests:calc_or_stall", "timeout_s": 120},
        "tasks": str(path),
        "verifier": {"type": "agents_for_tests:even_token"},
        "model": {"name_or_path": "tiny"},
        "sessions": {"max_run_workers": 16, "node_wait_s": 60, "max_node_retries": 2},
        "policy": {"type": "grpo", "kwargs": {"group_size": 4, "tasks_per_step": 2, "total_steps": total_steps,
                                              "learning_rate": 5.0e-2, "micro_batch_size": 64,
                                              "max_off_policy_steps": 0, "eval_samples": 1,
                                              # one round a step: the session counts below are the plan's
                                              "dynamic_sampling": {"max_extra_rounds": 0}, **policy}},
        "distribution": {"backend": "ray", **dist},
        "logging": {"checkpoint_freq": 1, "tensorboard": False, "progress_bar": False, "system_metrics_s": 0},
    })
    cfg._config_dir = AGENTIC_TESTS
    return cfg


# ---------------------------------------------------------------- refused at start (no cluster needed)
@pytest.mark.parametrize("dist, model, key", [
    ({"backend": "ray", "envs_per_worker": 4}, None, "distribution.envs_per_worker"),
    ({"backend": "ray", "rollout_resources": {"num_cpus": 2}}, None, "distribution.rollout_resources"),
    ({"backend": "ray", "autoscale": {"max_rollout_workers": 2}, "rollout_workers": 1}, None, "distribution.autoscale"),
    ({"backend": "local", "rollout_workers": 2}, None, "distribution.rollout_workers"),
    ({"backend": "local", "learner_resources": {"num_cpus": 2}}, None, "distribution.learner_resources"),
    ({"backend": "ray"}, {"name_or_path": "tiny", "engine": "openai_compat", "base_url": "http://127.0.0.1:9/v1",
                          "model": "m"}, "model.engine"),
    ({"backend": "ray"}, {"name_or_path": "vllm:http://127.0.0.1:9"}, "model.name_or_path"),
])
def test_a_distribution_an_agent_run_cannot_honour_fails_at_start_naming_the_key(tmp_path, monkeypatch, dist, model,
                                                                                 key):
    from polar.trainers.preflight import check_before_start

    # the session's shared cluster (tests/conftest.py) may already be connected when this runs in the full
    # suite, so "nothing was launched" is: no ray.init call, and the connection state as it was
    ray = pytest.importorskip("ray")
    connected_before = ray.is_initialized()
    init_calls: list[dict] = []
    monkeypatch.setattr(ray, "init", lambda *a, **kw: init_calls.append(kw))
    cfg = agent_cfg(tmp_path, {})
    cfg = cfg.model_copy(update={"distribution": type(cfg.distribution)(**dist),
                                 **({"model": type(cfg.model)(**model)} if model else {})})
    cfg._config_dir = AGENTIC_TESTS
    run = RunDir.create("x", tmp_path / "run")
    for check in (lambda: check_before_start(cfg), lambda: build_trainer(cfg, run)):
        with pytest.raises(ConfigError) as e:
            check()
        msg = str(e.value)
        assert msg.startswith(key) or f" {key} " in msg, msg
        assert "\n" not in msg
    # nothing was launched: no config written, no Ray cluster started or joined
    assert not run.config_path.exists()
    assert init_calls == [] and ray.is_initialized() == connected_before


def test_a_ray_agent_run_refuses_an_engine_object_it_cannot_ship(tmp_path):
    cfg = agent_cfg(tmp_path, {"rollout_workers": 2})
    with pytest.raises(ConfigError, match="engine object cannot be passed in"):
        build_trainer(cfg, RunDir.create("x", tmp_path / "run"), engine=object())


# ---------------------------------------------------------------- on a 2-node cluster
@pytest.fixture
def learner_box_cluster():
    """Two Ray nodes of 2 CPUs; only the head has the custom resource ``learner_box``."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    args = {"num_cpus": 2, "object_store_memory": 150 * 1024**2}
    cluster = Cluster(initialize_head=True,
                      head_node_args={**args, "include_dashboard": False, "resources": {"learner_box": 1}})
    worker = cluster.add_node(**args)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", include_dashboard=False)
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def ray_dist(cluster):
    return {"coordinator_address": cluster.address, "rollout_workers": 2, "gateway_resources": {"num_cpus": 0.5},
            "learner_resources": {"num_cpus": 1, "resources": {"learner_box": 1}}}


def sessions_index(run):
    path = run.path / "sessions" / "index.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.ray
@pytest.mark.slow  # ~90 s on the shared 2-core box (25 s of it the cluster): over the default suite's ~30 s
def test_grpo_on_ray_trains_over_two_gateway_nodes_with_the_learner_where_learner_resources_says(
        learner_box_cluster, tmp_path):
    import ray

    cluster, worker = learner_box_cluster
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("learner_box"))
    run = RunDir.create("ray-agent", tmp_path / "run")
    rows, seen = [], {}
    driver = None

    def watch(metrics):
        rows.append(metrics)
        if "nodes" not in seen:
            seen["nodes"] = ray.get(driver.actor.gateway_nodes.remote(), timeout=60)

    driver = build_trainer(agent_cfg(tmp_path, ray_dist(cluster), total_steps=2), run, on_iteration=watch)
    result = driver.train()

    assert result["iterations"] == 2 and result["grpo"]["steps"] == 2 and result["learner_restarts"] == 0
    # the learner actor ran on the node whose custom resource learner_resources asks for
    learner = run.read_meta()["learner"]
    assert learner["node_id"] == head and learner["node_id"] != worker.node_id
    # two gateway nodes (rollout_workers), spread over both Ray nodes; both served sessions
    nodes = seen["nodes"]
    assert len(nodes) == 2 and {n["ray_node_id"] for n in nodes} == {head, worker.node_id}
    index = sessions_index(run)
    assert len(index) == 2 * 2 * 4 and all(r["status"] == "done" for r in index)
    assert {r["node_id"] for r in index} == {n["node_id"] for n in nodes}
    assert {r["node_id"] for r in index if r["metadata"]["rollout_step"] == 1} == {n["node_id"] for n in nodes}
    # every step trained, and every node served the learner's weights: the rollout/learner logprob gap is
    # ~0 in step 2 too, whose sessions the updated weights generated on both nodes
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(not r["update_skipped"] for r in rows), rows
    assert [r["policy_version"] for r in rows] == [1, 2]
    assert all(r["logprob_gap_max"] < 1e-3 for r in rows), [r["logprob_gap_max"] for r in rows]
    assert all(r["gateway/nodes"] == 2 and r["sessions/step_failed"] == 0 for r in rows)
    assert [m["iteration"] for m in read_metrics(run.metrics_path)] == [1, 2]
    assert run.read_meta()["status"] == "finished"


@pytest.mark.ray
@pytest.mark.slow  # ~5 min on the shared 2-core box
def test_grpo_on_ray_survives_a_killed_node_and_its_sessions_move_to_the_survivor(learner_box_cluster, tmp_path):
    import ray

    cluster, worker = learner_box_cluster
    run = RunDir.create("ray-agent", tmp_path / "run")
    rows, seen = [], {}
    driver = None

    def chaos(metrics):
        rows.append(metrics)
        if metrics["iteration"] == 1:  # step 2's sessions are in flight (each harness waits hang_s first)
            seen["nodes"] = ray.get(driver.actor.gateway_nodes.remote(), timeout=60)
            cluster.remove_node(worker, allow_graceful=False)

    cfg = agent_cfg(tmp_path, ray_dist(cluster), total_steps=4, hang_s=4.0)
    driver = build_trainer(cfg, run, on_iteration=chaos)
    result = driver.train()

    assert result["iterations"] == 4 and result["learner_restarts"] == 0  # the learner lived on the head
    lost = next(n["node_id"] for n in seen["nodes"] if n["ray_node_id"] == worker.node_id)
    index = sessions_index(run)
    # nothing recorded was lost: every step's sessions finished, were kept, and trained
    assert len(index) == 4 * 2 * 4 and all(r["status"] == "done" for r in index), [r["error"] for r in index]
    assert [r["iteration"] for r in read_metrics(run.metrics_path)] == [1, 2, 3, 4]
    assert all(r["sessions/step_failed"] == 0 for r in rows)
    moved = [r for r in index if r["attempts"] > 1]
    assert moved and all(r["node_id"] != lost and r["lost_nodes"][0]["node_id"] == lost for r in moved)
    assert sum(r["sessions/step_redispatched"] for r in rows) == len(moved)
    assert rows[-1]["sessions/redispatched"] == len(moved)
    # after the loss no session finished on the lost node; the survivor (and a replacement) took the rest
    assert lost not in {r["node_id"] for r in index if r["metadata"].get("rollout_step", 0) >= 2}
