"""The Ray backend through the RolloutBackend contract, on the two-node test cluster."""

import pytest

from polar.config import RunConfig, validate
from polar.distributed.control import read_applied, request_scale
from polar.errors import ConfigError, DistributedError
from polar.rollout.backends.base import RolloutBackend, make_backend

pytestmark = pytest.mark.ray


def ray_cfg(address, **dist):
    return validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "policy": {"type": "ppo"},
        "distribution": {"backend": "ray", "coordinator_address": address, "rollout_workers": 2, "envs_per_worker": 2,
                         "rollout_resources": {"num_cpus": 0.5}, **dist},
    })


def policy_for(cfg):
    from polar.harness import make_vector_env
    from polar.models.policy import build_policy

    env = make_vector_env(cfg.harness, 1)
    return build_policy(cfg, env.single_observation_space, env.single_action_space)


def test_contract_versions_lag_and_scale_from_the_run_dir(ray_cluster, tmp_path):
    cfg = ray_cfg(ray_cluster.address)
    policy = policy_for(cfg)
    backend = make_backend(cfg, fragment_steps=8, seed=0)
    assert isinstance(backend, RolloutBackend) and backend.num_envs == 4
    backend.attach_run_dir(tmp_path)
    backend.start(policy.state_dict(), version=0)
    try:
        first = backend.next_fragment(timeout_s=60)
        assert first.policy_version == 0 and first.rewards.shape == (8, 2)
        backend.publish_weights(policy.state_dict(), version=1)
        frags = [backend.next_fragment(timeout_s=60) for _ in range(6)]
        # Each worker has at most 2 calls queued with version 0 when version 1 is published, and runs its calls
        # in order: per worker, versions never go back, and at most 2 fragments per worker are stale. Which
        # worker's fragment comes next is up to their speed (a slow node's stale fragments may come last).
        by_worker: dict[int, list[int]] = {}
        for f in frags:
            by_worker.setdefault(f.worker_id, []).append(f.policy_version)
        versions = [f.policy_version for f in frags]
        assert set(versions) <= {0, 1} and 1 in versions
        for seen in by_worker.values():
            assert seen == sorted(seen) and seen.count(0) <= 2, by_worker
        m = backend.metrics()
        assert m["rollout/workers"] == 2 and m["rollout/restarts"] == 0 and 0 <= m["rollout/policy_lag_mean"] <= 1
        request_scale(tmp_path, 3)
        backend._watcher.poll_interval_s = 0.0
        backend.next_fragment(timeout_s=60)
        assert backend.num_workers == 3 and backend.num_envs == 6
        assert read_applied(tmp_path)["rollout_workers"] == 3
    finally:
        backend.close()
        backend.close()  # safe twice
    import ray

    assert ray.is_initialized()  # we joined the cluster; closing does not tear it down


def test_zero_workers_is_a_config_error(ray_cluster):
    with pytest.raises(ConfigError, match="rollout_workers"):
        make_backend(ray_cfg(ray_cluster.address, rollout_workers=0), fragment_steps=8, seed=0)


def test_impossible_rollout_resources_fail_at_start(ray_cluster):
    cfg = ray_cfg(ray_cluster.address, rollout_resources={"num_cpus": 16})
    backend = make_backend(cfg, fragment_steps=8, seed=0)
    with pytest.raises(DistributedError, match=r"distribution\.rollout_resources"):
        backend.start(policy_for(cfg).state_dict())


def test_partial_start_runs_with_what_fits_and_keeps_the_rest_pending(ray_cluster):
    """A restarted learner on a cluster that lost a node: start once one rollout actor is up."""
    from polar.rollout.backends.ray_backend import RayBackend

    # 3 x 1.5 CPU: one fits on each 2-CPU node, the third fits nowhere while those two live
    cfg = ray_cfg(ray_cluster.address, rollout_workers=3, rollout_resources={"num_cpus": 1.5})
    with pytest.raises(DistributedError, match="in all"):
        make_backend(cfg, fragment_steps=8, seed=0).start(policy_for(cfg).state_dict())
    backend = RayBackend(cfg, fragment_steps=8, seed=0, partial_start=True)
    backend.start(policy_for(cfg).state_dict())
    try:
        import time

        workers, deadline = set(), time.monotonic() + 90
        while len(workers) < 2 and time.monotonic() < deadline:  # the second one may still be starting
            workers.add(backend.next_fragment(timeout_s=60).worker_id)
        workers |= {backend.next_fragment(timeout_s=60).worker_id for _ in range(8)}
        m = backend.metrics()
        assert m["rollout/workers"] == 3 and m["rollout/pending_workers"] == 1
        assert len(workers) == 2  # fragments come from the two that were placed, the third waits
    finally:
        backend.close()


def test_on_policy_actors_collect_every_fragment_with_the_newest_weights(ray_cluster):
    """PPO's mode: one call per actor, the next launched only after the weights of the update are published,
    so every batch is one fragment per actor, all of the current version (no call of old weights queued)."""
    cfg = ray_cfg(ray_cluster.address)
    policy = policy_for(cfg)
    backend = make_backend(cfg, fragment_steps=8, seed=0, on_policy=True)
    backend.start(policy.state_dict(), version=0)
    try:
        for version in range(3):
            frags = [backend.next_fragment(timeout_s=60) for _ in range(2)]
            assert sorted(f.worker_id for f in frags) == [0, 1]
            assert [f.policy_version for f in frags] == [version, version]
            backend.publish_weights(policy.state_dict(), version=version + 1)
        assert backend.metrics()["rollout/policy_lag_mean"] == 0
    finally:
        backend.close()
