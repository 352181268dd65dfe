"""Replay buffers: ring semantics, fragment flattening, dtypes, sampling distributions, sum tree, save/load."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from polar.errors import CheckpointError, ConfigError
from polar.types import Fragment

BOX4 = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
DISCRETE2 = gym.spaces.Discrete(2)


def add_ids(buf, ids, obs_dim=4):
    """Transitions whose every field is derived from one id, so a sampled tuple can be checked for consistency."""
    ids = np.asarray(ids)
    obs = np.repeat(ids[:, None], obs_dim, 1).astype(np.float32)
    buf.add(obs, ids % 2, ids + 0.5, obs + 1000, (ids % 3 == 0).astype(np.float32))


def sampled_ids(batch):
    return batch.obs[:, 0].numpy().astype(np.int64)


def assert_consistent(batch):
    ids = sampled_ids(batch)
    assert torch.equal(batch.actions, torch.from_numpy(ids % 2))
    assert torch.equal(batch.rewards, torch.from_numpy(ids + 0.5).float())
    assert torch.equal(batch.next_obs[:, 0], torch.from_numpy(ids + 1000.0).float())
    assert torch.equal(batch.terminated, torch.from_numpy((ids % 3 == 0).astype(np.float32)))


def test_ring_keeps_the_latest_capacity_transitions():
    buf = ReplayBuffer(5, BOX4, DISCRETE2, seed=1)
    add_ids(buf, [0, 1, 2])
    add_ids(buf, [3, 4, 5])
    add_ids(buf, [6])
    assert len(buf) == 5 and buf.capacity == 5
    batch = buf.sample(500)
    assert set(sampled_ids(batch)) == {2, 3, 4, 5, 6}
    assert_consistent(batch)
    # one add larger than the buffer keeps only its newest items, and the ring continues from there
    add_ids(buf, np.arange(100, 112))
    assert set(sampled_ids(buf.sample(500))) == set(range(107, 112))
    add_ids(buf, [200])  # overwrites the oldest survivor (107)
    assert set(sampled_ids(buf.sample(500))) == {108, 109, 110, 111, 200}


def make_fragment(T, N, obs_dim=2):
    ids = np.arange(T)[:, None] * 10 + np.arange(N)[None, :]  # [T, N], id = t*10 + n
    obs = np.stack([ids, -ids], -1).astype(np.float32)
    zeros = np.zeros((T, N), np.float32)
    frag = Fragment(obs=obs, actions=ids.astype(np.int64), log_probs=zeros, values=zeros,
                    rewards=(ids + 0.5).astype(np.float32), terminated=(ids % 4 == 0).astype(np.float32),
                    truncated=zeros, episode_starts=zeros, trunc_values=zeros, last_values=np.zeros(N, np.float32))
    frag.next_obs = obs + 1000
    return frag, ids


def test_add_fragment_flattens_time_major_and_keeps_tuples_together():
    T, N = 4, 3
    frag, ids = make_fragment(T, N)
    buf = ReplayBuffer(T * N, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), gym.spaces.Discrete(100), seed=0)
    assert buf.add_fragment(frag) == T * N and len(buf) == T * N
    batch = buf.sample(400)
    got = batch.obs[:, 0].numpy().astype(np.int64)
    # slot k holds step t = k // N of env n = k % N
    assert np.array_equal(got, (batch.indices // N) * 10 + batch.indices % N)
    assert set(got) == set(ids.ravel())
    assert torch.equal(batch.obs[:, 1], -batch.obs[:, 0])
    assert torch.equal(batch.actions, torch.from_numpy(got))
    assert torch.equal(batch.rewards, torch.from_numpy(got + 0.5).float())
    assert torch.equal(batch.next_obs, batch.obs + 1000)
    assert torch.equal(batch.terminated, torch.from_numpy((got % 4 == 0).astype(np.float32)))


def test_add_fragment_without_next_obs_is_a_clear_error():
    frag, _ = make_fragment(2, 2)
    frag.next_obs = None
    buf = ReplayBuffer(8, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), gym.spaces.Discrete(100))
    with pytest.raises(ValueError, match="next_obs"):
        buf.add_fragment(frag)


def test_dict_observations_round_trip_with_their_dtypes():
    space = gym.spaces.Dict({
        "img": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
        "vec": gym.spaces.Box(-1.0, 1.0, (2,), np.float64),
        "id": gym.spaces.Discrete(50),
        "bits": gym.spaces.MultiBinary(3),
    })
    buf = ReplayBuffer(16, space, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), seed=3)
    ids = np.arange(10)

    def obs_of(i, offset):
        return {"img": np.broadcast_to((i + offset)[:, None, None, None], (len(i), 4, 4, 3)).astype(np.uint8),
                "vec": np.stack([i + offset, i], -1).astype(np.float64),
                "id": i + offset,
                "bits": (np.stack([i, i >> 1, i >> 2], -1) & 1).astype(np.int8)}

    actions = np.stack([ids / 10, -ids / 10], -1).astype(np.float32)
    buf.add(obs_of(ids, 0), actions, ids.astype(np.float32), obs_of(ids, 1), np.zeros(10, np.float32))
    b = buf.sample(64)
    assert b.obs["img"].dtype == torch.uint8 and b.obs["img"].shape == (64, 4, 4, 3)
    assert b.obs["vec"].dtype == torch.float32 and b.obs["id"].dtype == torch.int64 and b.obs["id"].shape == (64,)
    assert b.obs["bits"].dtype == torch.int8
    i = b.obs["id"]
    assert torch.equal(b.obs["img"][:, 0, 0, 0].long(), i) and torch.equal(b.next_obs["img"][:, 3, 3, 2].long(), i + 1)
    assert torch.equal(b.next_obs["id"], i + 1) and torch.equal(b.next_obs["vec"][:, 1].long(), i)
    assert torch.equal(b.obs["bits"][:, 1].long(), (i >> 1) & 1)
    assert b.actions.dtype == torch.float32 and b.actions.shape == (64, 2)
    assert torch.allclose(b.actions[:, 0], i.float() / 10)


def test_image_obs_stay_uint8_and_discrete_actions_are_int64():
    img = gym.spaces.Box(0, 255, (8, 8, 1), np.uint8)
    buf = ReplayBuffer(4, img, gym.spaces.Discrete(6))
    obs = np.full((3, 8, 8, 1), 200, np.uint8)
    buf.add(obs, np.array([5, 4, 3]), np.ones(3), obs, np.array([True, False, False]))
    b = buf.sample(7)
    assert b.obs.dtype == torch.uint8 and b.obs.shape == (7, 8, 8, 1) and int(b.obs.max()) == 200
    assert b.actions.dtype == torch.int64 and b.actions.shape == (7,)
    assert b.rewards.dtype == torch.float32 and b.terminated.dtype == torch.float32 and b.weights.dtype == torch.float32
    assert torch.equal(b.weights, torch.ones(7)) and b.indices.dtype == np.int64
    with pytest.raises(ValueError, match="does not cast safely"):
        buf.add(obs.astype(np.float32) / 255, np.array([0, 1, 2]), np.ones(3), obs, np.zeros(3))
    with pytest.raises(ValueError, match="actions has shape"):
        buf.add(obs, np.array([[0], [1], [2]]), np.ones(3), obs, np.zeros(3))
    assert len(buf) == 3  # rejected adds wrote nothing


def test_uniform_sampling_covers_every_slot_evenly():
    buf = ReplayBuffer(50, BOX4, DISCRETE2, seed=7)
    add_ids(buf, np.arange(50))
    idx = np.concatenate([buf.sample(1000).indices for _ in range(50)])
    counts = np.bincount(idx, minlength=50)
    expected = len(idx) / 50
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 49 degrees of freedom: mean 49, sd ~10; a sampler that skipped one slot would add ~1000
    assert counts.min() > 0 and chi2 < 100


def test_partly_filled_buffers_sample_only_stored_slots():
    for buf in (ReplayBuffer(64, BOX4, DISCRETE2), PrioritizedReplayBuffer(64, BOX4, DISCRETE2)):
        add_ids(buf, np.arange(5))
        idx = buf.sample(2000, beta=0.4).indices
        assert idx.min() >= 0 and idx.max() < 5 and len(set(idx)) == 5


def test_prioritized_sampling_follows_priorities_and_weights_correct_for_it():
    eps, alpha, beta = 1e-6, 0.6, 0.4
    buf = PrioritizedReplayBuffer(10, BOX4, DISCRETE2, seed=11, alpha=alpha, eps=eps)
    add_ids(buf, np.arange(10))
    td = np.full(10, 1.0 - eps)  # p = 1 -> p^alpha = 1 for nine slots
    td[3] = 81.0 ** (1 / alpha) - eps  # p^alpha = 81: 81 / (81 + 9) = 90% of the mass
    buf.update_priorities(np.arange(10), td)
    assert buf.total_priority == pytest.approx(90.0, rel=1e-9)
    batches = [buf.sample(256, beta=beta) for _ in range(20)]
    idx = np.concatenate([b.indices for b in batches])
    assert 0.85 < np.mean(idx == 3) < 0.95
    others = np.bincount(idx[idx != 3], minlength=10)
    assert all(others[i] > 0 for i in range(10) if i != 3)
    for b in batches:
        w = b.weights.numpy()
        assert w.max() == pytest.approx(1.0)
        hot = b.indices == 3
        assert hot.any() and (~hot).any()
        # w ~ (N P(i))^-beta, normalized by the largest (a low-priority item)
        assert np.allclose(w[hot], 81.0 ** -beta, rtol=1e-5) and np.allclose(w[~hot], 1.0)
    assert_consistent(batches[0])


def test_prioritized_sampling_is_stratified():
    buf = PrioritizedReplayBuffer(16, BOX4, DISCRETE2, seed=2)
    add_ids(buf, np.arange(16))
    # equal priorities, one segment per slot: every slot exactly once (i.i.d. draws would repeat some)
    for _ in range(5):
        assert sorted(buf.sample(16, beta=0.4).indices) == list(range(16))


def test_new_transitions_get_the_max_priority_seen():
    buf = PrioritizedReplayBuffer(8, BOX4, DISCRETE2, alpha=1.0)
    add_ids(buf, np.arange(4))
    buf.update_priorities(np.array([0, 1]), np.array([5.0, -0.5]))
    add_ids(buf, [4])
    assert buf.priorities[4] == pytest.approx(5.0 + buf.eps) and buf.priorities[1] == pytest.approx(0.5 + buf.eps)


def test_update_priorities_rejects_non_finite_and_out_of_range_entries():
    buf = PrioritizedReplayBuffer(8, BOX4, DISCRETE2)
    add_ids(buf, np.arange(4))
    before = buf.tree.copy()
    with pytest.raises(ValueError, match=r"td_errors\[1\] = nan"):
        buf.update_priorities(np.array([0, 2]), np.array([0.1, np.nan]))
    with pytest.raises(ValueError, match=r"td_errors\[0\] = inf"):
        buf.update_priorities(np.array([0]), np.array([np.inf]))
    with pytest.raises(ValueError, match=r"indices\[0\] = 6"):
        buf.update_priorities(np.array([6]), np.array([1.0]))
    assert np.array_equal(buf.tree, before)


def test_sum_tree_stays_exact_under_many_random_updates():
    rng = np.random.default_rng(0)
    alpha = 0.7
    buf = PrioritizedReplayBuffer(1000, BOX4, DISCRETE2, alpha=alpha)  # not a power of two: 1024 leaves
    add_ids(buf, np.arange(700))
    for _ in range(300):
        idx = rng.integers(0, 700, size=64)  # duplicates included
        buf.update_priorities(idx, rng.normal(size=64) * rng.uniform(0.01, 100))
    add_ids(buf, np.arange(700, 1100))  # wraps: new items at max priority
    assert buf.total_priority == pytest.approx(math.fsum(buf.priorities ** alpha), rel=1e-6)
    leaves = buf.tree[buf.cap_pow2:]
    assert np.array_equal(leaves[:1000], buf.priorities ** alpha) and not leaves[1000:].any()
    internal = np.arange(1, buf.cap_pow2)
    assert np.array_equal(buf.tree[internal], buf.tree[2 * internal] + buf.tree[2 * internal + 1])
    # a slot updated twice in one call keeps the last value
    buf.update_priorities(np.array([5, 9, 5]), np.array([1.0, 2.0, 3.0]))
    assert buf.priorities[5] == 3.0 + buf.eps and buf.priorities[9] == 2.0 + buf.eps


def assert_batches_equal(a, b):
    assert np.array_equal(a.indices, b.indices)
    for name in ("obs", "actions", "rewards", "next_obs", "terminated", "weights"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("n_added", [27, 6])  # wrapped (pos 7), or partly filled (pos 6)
def test_save_load_restores_contents_position_and_rng(tmp_path, cls, n_added):
    buf = cls(20, BOX4, DISCRETE2, seed=5)
    add_ids(buf, np.arange(n_added))
    for _ in range(3):
        b = buf.sample(16, beta=0.5)
        if cls is PrioritizedReplayBuffer:
            buf.update_priorities(b.indices, np.linspace(-3, 3, 16))
    path = tmp_path / "replay.npz"
    buf.save(path)
    assert path.is_file() and not (tmp_path / "replay.npz.tmp").exists()
    with np.load(path, allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)

    fresh = cls(20, BOX4, DISCRETE2, seed=999)
    fresh.load(path)
    assert len(fresh) == len(buf) == min(n_added, 20)
    assert_batches_equal(fresh.sample(64, beta=0.5), buf.sample(64, beta=0.5))
    add_ids(fresh, [500, 501])
    add_ids(buf, [500, 501])
    after = buf.sample(1000, beta=0.5)
    assert_batches_equal(fresh.sample(1000, beta=0.5), after)
    assert set(after.indices) == set(range(len(buf)))  # the comparison covered every slot
    assert set(sampled_ids(after)) == set(range(max(0, n_added - 18), n_added)) | {500, 501}
    if cls is PrioritizedReplayBuffer:
        assert np.array_equal(fresh.tree, buf.tree) and fresh.max_priority == buf.max_priority


def test_load_rejects_a_buffer_saved_for_another_env(tmp_path):
    buf = ReplayBuffer(20, BOX4, DISCRETE2)
    add_ids(buf, np.arange(5))
    path = tmp_path / "replay.npz"
    buf.save(path)
    other = ReplayBuffer(20, gym.spaces.Box(-1, 1, (5,), np.float32), DISCRETE2)
    add_ids(other, np.arange(3), obs_dim=5)
    with pytest.raises(CheckpointError, match=r"replay\.npz.*observation.*\(4,\).*\(5,\)"):
        other.load(path)
    assert len(other) == 3  # untouched
    with pytest.raises(CheckpointError, match="capacity is 20 in the file but 30 here"):
        ReplayBuffer(30, BOX4, DISCRETE2).load(path)
    with pytest.raises(CheckpointError, match="actions"):
        ReplayBuffer(20, BOX4, gym.spaces.Box(-1, 1, (2,), np.float32)).load(path)
    with pytest.raises(CheckpointError, match="buffer type"):
        PrioritizedReplayBuffer(20, BOX4, DISCRETE2).load(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="unreadable"):
        buf.load(tmp_path / "junk.npz")


@pytest.mark.parametrize("space", [gym.spaces.MultiDiscrete([3, 3]), gym.spaces.Tuple((DISCRETE2, DISCRETE2)),
                                   gym.spaces.MultiBinary(4)])
def test_unsupported_action_space_is_a_config_error(space):
    with pytest.raises(ConfigError, match="Discrete or Box actions"):
        ReplayBuffer(10, BOX4, space)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ConfigError, match="observation"):
        ReplayBuffer(10, gym.spaces.Tuple((BOX4,)), DISCRETE2)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0, BOX4, DISCRETE2)
    for buf in (ReplayBuffer(10, BOX4, DISCRETE2), PrioritizedReplayBuffer(10, BOX4, DISCRETE2)):
        with pytest.raises(ValueError, match="replay buffer is empty"):
            buf.sample(4, beta=0.4)
    per = PrioritizedReplayBuffer(10, BOX4, DISCRETE2)
    add_ids(per, [1])
    with pytest.raises(ValueError, match="beta"):
        per.sample(4)
    assert per.sample(4, beta=1.0).indices.tolist() == [0, 0, 0, 0]  # batch larger than the buffer
