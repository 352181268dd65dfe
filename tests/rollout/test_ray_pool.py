"""Rollout actors on a two-node cluster: versions, first-ready fragments, replacement, elasticity."""

import pytest
import torch

from polar.config import RunConfig, validate
from polar.errors import DistributedError

pytestmark = pytest.mark.ray


def cfg_data(**policy_kwargs):
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"},
                               "policy": {"type": "ppo", "kwargs": policy_kwargs}})
    return cfg.model_dump(mode="json")


def make_pool(n=2, **kw):
    from polar.rollout.backends.ray_pool import RayRolloutPool

    return RayRolloutPool(cfg_data(), None, num_workers=n, envs_per_worker=2, num_steps=16, num_cpus=0.5, **kw)


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
