"""One small two-node Ray cluster per test session (2 logical CPUs per node, no dashboard)."""

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    node_args = {"num_cpus": 2, "object_store_memory": 150 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", include_dashboard=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
