"""The sharded store: FIFO with backpressure, replay sampling, shards on more than one node."""

import numpy as np
import pytest

from polar.distributed.replay_store import ShardedStore

pytestmark = pytest.mark.ray


def test_fifo_backpressure_then_drain(ray_cluster):
    store = ShardedStore(num_shards=2, capacity_per_shard=3, mode="fifo")
    store.wait_ready()
    try:
        accepted = [store.put({"obs": np.full(4, i)}, timeout_s=0.2).accepted for i in range(8)]
        assert accepted == [True] * 6 + [False, False]  # 2 shards x 3, then producers are told to back off
        assert store.depth() == 6
        assert sum(s["rejected"] for s in store.stats()) == 2
        got = store.get(10, timeout_s=0.5)
        assert sorted(int(x["obs"][0]) for x in got) == list(range(6))  # each item exactly once
        assert store.depth() == 0
        assert store.put({"obs": np.zeros(4)}, timeout_s=0.2).accepted  # room again
    finally:
        store.close()


def test_blocked_producer_resumes_when_a_consumer_frees_room(ray_cluster):
    import ray

    store = ShardedStore(num_shards=1, capacity_per_shard=1, mode="fifo")
    store.wait_ready()
    try:
        assert store.put("first", timeout_s=0.1).accepted

        @ray.remote(num_cpus=0)
        def producer(s):
            return s.put("second", timeout_s=30.0).accepted

        pending = producer.remote(store)  # the store travels as its shard handles
        ready, _ = ray.wait([pending], timeout=1.0)
        assert not ready  # blocked on the full shard
        assert store.get(1, timeout_s=1.0) == ["first"]
        assert ray.get(pending, timeout=30) is True
        assert store.get(1, timeout_s=5.0) == ["second"]
    finally:
        store.close()


def test_replay_mode_samples_evicts_and_throttles(ray_cluster):
    store = ShardedStore(num_shards=2, capacity_per_shard=4, mode="replay", max_inserts_per_sample=1.0)
    store.wait_ready()
    try:
        for i in range(8):
            assert store.put(i, timeout_s=0.1).accepted
        # inserts may not run more than capacity ahead of sampling
        assert not store.put(99, timeout_s=0.1).accepted
        batch = store.sample(16)
        assert len(batch) == 16 and set(batch) <= set(range(8))
        assert store.put(100, timeout_s=1.0).accepted  # sampling let the producer go on
        stats = store.stats()
        assert sum(s["evicted"] for s in stats) == 1 and store.depth() == 8
    finally:
        store.close()


def test_shards_can_live_on_different_nodes(ray_cluster):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node_ids = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    from polar.distributed.replay_store import _remote_shard_cls

    cls = _remote_shard_cls()
    shards = [
        cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote(i, 4, "fifo", 0.0, 0)
        for i, nid in enumerate(node_ids)
    ]
    store = ShardedStore(mode="fifo", shards=shards)
    store.wait_ready()
    try:
        for i in range(4):
            assert store.put(i).accepted
        assert [s["depth"] for s in store.stats()] == [2, 2]
        assert sorted(store.get(4)) == [0, 1, 2, 3]
    finally:
        store.close()
