"""Connecting to Ray: bounded failures that name the address, impossible requests refused at start."""

import pytest

from polar.distributed.cluster import RoleRequest, alive_nodes, check_placeable, connect, wait_ready
from polar.errors import DistributedError


def test_unreachable_address_fails_in_bounded_time_naming_it():
    with pytest.raises(DistributedError) as e:
        connect("ray://127.0.0.1:1", connect_timeout_s=2.0)
    assert "ray://127.0.0.1:1" in str(e.value)
    assert "coordinator_address" in str(e.value)


def test_malformed_address_is_a_clear_error():
    with pytest.raises(DistributedError, match="not 'auto'"):
        connect("somewhere-without-port", connect_timeout_s=1.0)


def test_check_placeable_names_the_role_and_the_nodes():
    nodes = [{"node_id": "a", "address": "10.0.0.1", "resources": {"CPU": 2.0}}]
    check_placeable([RoleRequest("rollout", 2, 1.0)], nodes)
    with pytest.raises(DistributedError) as e:
        check_placeable([RoleRequest("learner", 1, 1.0, num_gpus=1, config_key="distribution.learner_resources")], nodes)
    assert "distribution.learner_resources" in str(e.value) and "10.0.0.1: CPU=2 GPU=0" in str(e.value)
    with pytest.raises(DistributedError, match="in all"):
        check_placeable([RoleRequest("rollout", 3, 1.0)], nodes)


@pytest.mark.ray
def test_connect_to_a_running_cluster_and_refuse_what_no_node_has(ray_cluster):
    handle = connect(ray_cluster.address, connect_timeout_s=10.0, requests=[RoleRequest("rollout", 2, 1.0)])
    assert len(handle.nodes) == 2 and not handle.started_local
    assert {n["resources"]["CPU"] for n in alive_nodes()} == {2.0}
    with pytest.raises(DistributedError, match="num_cpus=8"):
        connect(ray_cluster.address, requests=[RoleRequest("rollout", 1, 8.0, config_key="distribution.rollout_resources")])


@pytest.mark.ray
def test_actor_waiting_for_resources_is_reported_not_hung(ray_cluster):
    import ray

    @ray.remote(num_cpus=0, resources={"no_such_accelerator": 1})
    class Stuck:
        def ready(self):
            return True

    actor = Stuck.remote()
    try:
        with pytest.raises(DistributedError, match="did not start within"):
            wait_ready([actor.ready.remote()], timeout_s=2.0, what="test actors")
    finally:
        ray.kill(actor)


@pytest.mark.ray
def test_a_fresh_driver_joins_by_gcs_address(ray_cluster):
    """The path a real driver takes: ray not yet initialized, coordinator_address = 'host:port'."""
    import subprocess
    import sys

    code = (
        "from polar.distributed.cluster import connect, RoleRequest\n"
        f"h = connect({ray_cluster.address!r}, 30.0, [RoleRequest('rollout', 2, 1.0)])\n"
        "print(len(h.nodes), h.started_local)\n"
        "h.shutdown()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["2", "False"]
