"""Rollout actors on a two-node cluster: versions, first-ready fragments, replacement, elasticity."""

import pytest
import torch

from polar.config import RunConfig, validate
from polar.errors import DistributedError

pytestmark = pytest.mark.ray


def cfg_data(agent=None, **policy_kwargs):
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"},
                               "policy": {"type": "ppo", "kwargs": policy_kwargs}, **({"agent": agent} if agent else {})})
    return cfg.model_dump(mode="json")


def make_pool(n=2, data=None, **kw):
    from polar.rollout.backends.ray_pool import RayRolloutPool

    return RayRolloutPool(data or cfg_data(), None, num_workers=n, envs_per_worker=2, num_steps=16, num_cpus=0.5, **kw)


def built_policy(data):
    from polar.harness import make_vector_env
    from polar.models.policy import build_policy

    cfg = validate(RunConfig, data)
    env = make_vector_env(cfg.harness, 1)
    return build_policy(cfg, env.single_observation_space, env.single_action_space)


def acts_with(policy, frag) -> bool:
    """Whether a fragment's log-probs are the given policy's."""
    with torch.no_grad():
        lp, _, _ = policy.agent.evaluate_actions(torch.tensor(frag.obs[0]), torch.tensor(frag.actions[0]))
    return torch.allclose(lp, torch.as_tensor(frag.log_probs[0]), atol=1e-5)


def test_fragments_carry_the_published_version_and_come_from_both_nodes(ray_cluster):
    import ray

    from polar.harness import make_vector_env
    from polar.models.policy import build_policy

    pool = make_pool(4, start_timeout_s=60)
    try:
        nodes = {ray.get(a.ready.remote())["node_id"] for a in pool.actors().values()}
        assert len(nodes) == 2  # 4 x 0.5 CPU does not fit one 2-CPU node beside the others' work... spread
        env = make_vector_env(validate(RunConfig, cfg_data()).harness, 1)
        policy = build_policy(validate(RunConfig, cfg_data()), env.single_observation_space, env.single_action_space)
        pool.publish(policy.state_dict(), version=3)
        frags = pool.collect_round(timeout_s=60)
        assert len(frags) == 4 and {f.policy_version for f in frags} == {3}
        assert {f.worker_id for f in frags} == set(pool.actors())
        assert all(f.env_steps == 32 for f in frags)
        # the workers act with the published weights: their log-probs match the learner's policy
        f = frags[0]
        with torch.no_grad():
            lp, _, _ = policy.agent.evaluate_actions(torch.tensor(f.obs[0]), torch.tensor(f.actions[0]))
        assert torch.allclose(lp, torch.as_tensor(f.log_probs[0]), atol=1e-5)
    finally:
        pool.close()


@pytest.mark.parametrize("hidden", [[64, 64], [256, 256]], ids=["inline", "object-store"])
def test_each_worker_gets_each_weights_version_once(ray_cluster, hidden):
    """Small weights ride inline in a call, large ones as one shared object-store copy; either way a worker
    gets a version with one call, and the calls after it carry none until the next publish."""
    from polar.rollout.backends.ray_pool import INLINE_WEIGHTS_BYTES

    data = cfg_data(agent={"type": "mlp", "hidden_sizes": hidden})
    pool = make_pool(2, data=data, start_timeout_s=60)
    try:
        policy = built_policy(data)
        size = sum(v.numel() * v.element_size() for v in policy.state_dict().values())
        assert (size > INLINE_WEIGHTS_BYTES) == (hidden == [256, 256])
        pool.publish(policy.state_dict(), version=1)
        frags = [pool.next_fragment(timeout_s=60) for _ in range(8)]  # 2 calls queued per worker, then relaunched
        assert {f.policy_version for f in frags} == {1} and all(acts_with(policy, f) for f in frags)
        assert pool.stats.weight_shipments == 2
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.1)
        pool.publish(policy.state_dict(), version=2)
        with torch.no_grad():
            for p in policy.parameters():
                p.sub_(0.1)  # the learner goes on updating in place: the published copy must not follow
        newer = [f for f in (pool.next_fragment(timeout_s=60) for _ in range(12)) if f.policy_version == 2]
        assert newer and pool.stats.weight_shipments == 4
        assert not any(acts_with(policy, f) for f in newer)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.1)
        assert all(acts_with(policy, f) for f in newer)
        assert pool.metrics()["rollout/weight_shipments"] == 4
    finally:
        pool.close()


def test_rollout_calls_record_no_ray_task_events(ray_cluster):
    """Hundreds of sample calls a second would each cost the driver, the actor and the GCS a task event."""
    import time
    from collections import Counter

    import ray

    def events() -> Counter:
        return Counter(str(e.get("name")) for e in ray.timeline())

    time.sleep(2.5)  # task events are flushed to the GCS every second: earlier tests' on this cluster are in
    before = events()
    pool = make_pool(1, start_timeout_s=60)
    try:
        for _ in range(4):
            pool.next_fragment(timeout_s=60)
        time.sleep(2.5)
        new = events() - before  # this pool's, whatever other tests left in the cluster's timeline
        assert new["sample"] == 0 and new["task:execute"] == 0, sorted(new.items())
    finally:
        pool.close()


def test_killed_actor_is_replaced_and_its_fragment_counted(ray_cluster):
    import ray

    pool = make_pool(2, start_timeout_s=60)
    try:
        pool.next_fragment(timeout_s=60)
        victim = next(iter(pool.actors().values()))
        ray.kill(victim, no_restart=True)
        got = [pool.next_fragment(timeout_s=60) for _ in range(6)]
        assert pool.stats.restarts == 1 and pool.stats.dropped_fragments == 1
        assert pool.stats.dropped_episodes == 2  # the two env copies' episodes in progress
        assert len(pool.actors()) == 2 and victim not in pool.actors().values()
        assert all(g.env_steps == 32 for g in got)
    finally:
        pool.close()


def wait_started(pool, timeout_s=90.0):
    """Bounded wait until added actors finished their constructors."""
    import time

    deadline = time.monotonic() + timeout_s
    while any(s.ready_ref is not None for s in pool.slots.values()):
        assert time.monotonic() < deadline, "added rollout actors did not start"
        pool.fill()
        time.sleep(0.1)


@pytest.mark.slow
def test_elastic_grow_and_shrink_while_collecting(ray_cluster):
    pool = make_pool(1, start_timeout_s=60)
    try:
        pool.next_fragment(timeout_s=60)
        pool.set_num_workers(3)
        wait_started(pool)
        seen = {pool.next_fragment(timeout_s=60).worker_id for _ in range(12)}
        assert len(seen) == 3
        pool.set_num_workers(1)
        assert pool.num_workers == 1
        for _ in range(50):  # retiring workers leave once their queued fragments are in
            pool.next_fragment(timeout_s=60)
            if len(pool.actors()) == 1:
                break
        assert len(pool.actors()) == 1
        assert pool.stats.dropped_fragments == 0  # shrinking waits for in-flight fragments
    finally:
        pool.close()


def test_bad_harness_fails_at_start_with_the_config_message(ray_cluster):
    from polar.rollout.backends.ray_pool import RayRolloutPool

    bad = cfg_data()
    bad["harness"]["id"] = "CartPol-v1"
    with pytest.raises(DistributedError, match="CartPole-v1"):
        RayRolloutPool(bad, None, num_workers=1, envs_per_worker=1, num_steps=4, num_cpus=0.5, start_timeout_s=60)
