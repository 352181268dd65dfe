"""A Ray agent run on launched vLLM replicas (issue 35, item 2): ``model: {engine: vllm}`` with
``distribution.backend: ray``. Each gateway node (a Ray actor, one per Ray node of a 2-node
``ray.cluster_utils.Cluster``) launches and supervises its own vLLM CPU server; every GRPO update is synced
into the replicas of both nodes (each node writes its weights apart); and a replica SIGKILLed mid-run is
restarted by its node with the current weights while the run goes on. Slow: two vLLM starts, a restart and
three GRPO steps of SmolLM2-135M on 2 cores take several minutes."""

import json
import os
import signal
from pathlib import Path

import pytest

from polar.config import RunConfig, validate
from polar.metrics.logger import read_metrics
from polar.trainers.build import build_trainer
from polar.trainers.run_dir import RunDir
from tests.distributed.test_ray_agent_run import learner_box_cluster, ray_dist, sessions_index  # noqa: F401

HARNESSES = Path(__file__).resolve().parents[1] / "inference"  # vllm_agents: one sampled token, its reward

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]


def vllm_api_servers() -> set[int]:
    """Pids of live vLLM API servers on this machine (their command line names the entry point)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"vllm.entrypoints.openai.api_server" in cmdline:
                pids.add(int(entry))
    return pids


def test_grpo_on_ray_with_launched_vllm_replicas_on_both_nodes_syncs_and_survives_a_killed_replica(
        learner_box_cluster, tmp_path):  # noqa: F811
    import ray

    cluster, worker = learner_box_cluster
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"Name a number ({i})."}) + "\n" for i in range(4)))
    cfg = validate(RunConfig, {
        "name": "ray-vllm",
        "harness": {"type": "agent", "callable": "vllm_agents:one_token", "timeout_s": 600},
        "tasks": str(tasks),
        "verifier": {"type": "vllm_agents:token_reward"},
        "model": {"name_or_path": "smollm2-135m", "engine": "vllm", "replicas": 1,
                  "engine_kwargs": {"enforce_eager": True, "max_model_len": 1024}},
        "gateway": {"model_aliases": ["smollm2"]},  # the name vllm_agents asks for
        "sessions": {"max_run_workers": 8, "node_wait_s": 600, "max_node_retries": 2},
        "policy": {"type": "grpo", "kwargs": {"group_size": 4, "tasks_per_step": 2, "total_steps": 3,
                                              "learning_rate": 1.0e-5, "micro_batch_size": 8, "kl_coef": 0.0,
                                              "max_off_policy_steps": 0, "eval_samples": 1,
                                              "dynamic_sampling": {"max_extra_rounds": 0}}},
        "distribution": {"backend": "ray", **ray_dist(cluster), "connect_timeout_s": 900},
        "logging": {"checkpoint_freq": 0, "tensorboard": False, "progress_bar": False, "system_metrics_s": 0},
    })
    cfg._config_dir = HARNESSES
    run = RunDir.create("ray-vllm", tmp_path / "run")
    before = vllm_api_servers()  # e.g. the session's shared replica, when the suite runs it
    rows, seen = [], {}
    driver = None

    def chaos(metrics):
        rows.append(metrics)
        if metrics["iteration"] == 1:  # kill one node's replica: step 2's calls there wait for its restart
            seen["nodes"] = ray.get(driver.actor.gateway_nodes.remote(), timeout=60)
            ours = sorted(vllm_api_servers() - before)
            seen["servers"] = ours
            os.kill(ours[0], signal.SIGKILL)

    driver = build_trainer(cfg, run, on_iteration=chaos)
    result = driver.train()

    assert result["iterations"] == 3 and result["learner_restarts"] == 0
    # one launched server per gateway node, and the gateway nodes on both Ray nodes
    assert len(seen["servers"]) == 2, seen
    nodes = seen["nodes"]
    assert len(nodes) == 2 and worker.node_id in {n["ray_node_id"] for n in nodes}
    assert len({n["ray_node_id"] for n in nodes}) == 2
    logs = sorted((run.path / "vllm").glob("node-*/replica-0.log"))
    assert len(logs) == 2, logs
    restarted = [p for p in logs if "=== polar: start 2 of replica 0" in p.read_text(errors="replace")]
    assert len(restarted) == 1, "the killed replica was not restarted by its node"
    # nothing was lost: every session of every step finished and trained
    index = sessions_index(run)
    assert len(index) == 3 * 2 * 4 and all(r["status"] == "done" for r in index), [r["error"] for r in index]
    assert {r["node_id"] for r in index} == {n["node_id"] for n in nodes}
    metrics = read_metrics(run.metrics_path)
    assert [m["iteration"] for m in metrics] == [1, 2, 3]
    assert all(r["sessions/step_failed"] == 0 for r in rows)
    # live sync: each node wrote its own synced weights, and the records of steps 2 and 3 carry the versions
    # the learner pushed (served by vLLM in bf16, scored by the fp32 learner: a small logprob gap)
    synced = sorted(p.name for p in (run.path / "gateway" / "weight_sync").iterdir())
    assert synced == sorted(n["node_id"] for n in nodes), synced
    versions: dict[int, int] = {}
    for path in (run.path / "gateway" / "sessions").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            versions[rec["policy_version"]] = versions.get(rec["policy_version"], 0) + 1
    assert {1, 2} <= set(versions), versions
    assert all(abs(m["logprob_gap_mean"]) < 0.5 for m in metrics if "logprob_gap_mean" in m)
    # the replicas went with the run (bounded wait: SIGTERM, then their engine cores)
    import time

    deadline = time.monotonic() + 60
    while vllm_api_servers() - before and time.monotonic() < deadline:
        time.sleep(1)
    assert vllm_api_servers() - before == set()
