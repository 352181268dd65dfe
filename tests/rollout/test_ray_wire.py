"""What a rollout actor's calls carry: weights and fragments packed into one buffer each, unpacked exactly."""

import dataclasses

import numpy as np
import torch

from polar.rollout.backends.ray_actor import (
    LayoutCodec,
    pack_arrays,
    pack_fragment,
    state_to_numpy,
    unpack_fragment,
    unpack_weights,
)
from polar.types import Fragment

T, N = 5, 3


def dict_obs_fragment() -> Fragment:
    rng = np.random.default_rng(0)
    return Fragment(
        obs={"image": rng.integers(0, 255, (T, N, 4, 4), dtype=np.uint8), "pos": rng.normal(size=(T, N, 2))},
        actions=rng.integers(0, 4, (T, N)), log_probs=rng.normal(size=(T, N)).astype(np.float32),
        values=rng.normal(size=(T, N)).astype(np.float32), rewards=rng.normal(size=(T, N)).astype(np.float32),
        terminated=rng.random((T, N)) < 0.2, truncated=np.zeros((T, N), bool),
        episode_starts=rng.random((T, N)) < 0.2, trunc_values=np.zeros((T, N), np.float32),
        last_values=rng.normal(size=N).astype(np.float32),
        initial_state=(np.ones((N, 8), np.float32), np.zeros((N, 8), np.float32)),
        policy_version=7, worker_id=2, episode_returns=[1.5, 2.0], episode_lengths=[3, 4], episode_successes=[1.0],
        connector_process_restarts=1, connector_copies_restarted=2,
        obs_moments={"pos": (np.zeros(2), np.ones(2), 10.0)}, return_moments=(0.0, 1.0, 5.0),
        next_obs={"image": np.zeros((T, N, 4, 4), np.uint8), "pos": np.asfortranarray(rng.normal(size=(T, N, 2)))},
        trace_id="w2-1-abc", collect_s=0.25, durations=np.ones((T, N), np.int64)[:, ::-1],
    )


def assert_same(a: object, b: object) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_a_packed_fragment_is_one_buffer_and_unpacks_to_every_field():
    frag, actor, driver = dict_obs_fragment(), LayoutCodec(), LayoutCodec()
    packed = pack_fragment(frag, actor)
    assert isinstance(packed, tuple)
    raw_layout, blob, rest = packed
    assert isinstance(raw_layout, bytes) and isinstance(blob, bytes)  # Ray pickles neither
    layout = driver.decode(raw_layout)
    # every numeric array (dict observations' included) is in the buffer, not pickled one by one
    assert {(name, key) for name, key, *_ in layout} >= {("obs", "image"), ("obs", "pos"), ("next_obs", "pos"),
                                                          ("actions", None), ("durations", None)}
    assert not any(isinstance(v, np.ndarray) for v in rest.values())
    out = unpack_fragment(packed, driver)
    for f in dataclasses.fields(Fragment):
        assert_same(getattr(frag, f.name), getattr(out, f.name))
    assert out.obs["image"].flags.writeable and out.actions.flags.writeable  # learners may write in place
    assert out.obs["image"].ctypes.data % 16 == 0 and out.rewards.ctypes.data % 16 == 0


def test_a_packed_fragment_is_a_snapshot():
    frag, codec = dict_obs_fragment(), LayoutCodec()
    packed = pack_fragment(frag, codec)
    frag.rewards[...] = 99.0  # the runner reuses its buffers for the next fragment
    out = unpack_fragment(packed, codec)
    assert not np.any(out.rewards == 99.0)
    out.actions[...] = -1  # each unpack owns its arrays
    assert not np.any(unpack_fragment(packed, codec).actions == -1)


def test_a_fragment_with_object_arrays_travels_as_is():
    frag = dataclasses.replace(dict_obs_fragment(), obs=np.array([["a"] * N] * T, dtype=object))
    assert pack_fragment(frag, LayoutCodec()) is frag
    assert unpack_fragment(frag, LayoutCodec()) is frag


def test_packed_weights_load_exactly_and_do_not_follow_the_learner():
    src, dst = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8)), torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    src.train()
    src(torch.randn(16, 4))  # running stats and the int64 batch counter are in the state dict too
    published = {k: v.clone() for k, v in src.state_dict().items()}
    layout, blob = pack_arrays({(k, None): a for k, a in state_to_numpy(src.state_dict()).items()})
    with torch.no_grad():
        src[0].weight.add_(1.0)  # the learner updates in place after publishing
    dst.load_state_dict(unpack_weights(LayoutCodec().decode(LayoutCodec().encode(layout)), blob))
    for k, v in dst.state_dict().items():
        assert v.dtype == published[k].dtype and torch.equal(v, published[k]), k


def test_a_layout_is_encoded_and_parsed_once_while_it_is_unchanged():
    actor, driver = LayoutCodec(), LayoutCodec()
    frags = [dict_obs_fragment() for _ in range(3)]
    raws = [pack_fragment(f, actor)[0] for f in frags]
    assert raws[0] is raws[1] is raws[2]  # the same bytes object: no JSON per fragment
    assert driver.decode(raws[0]) is driver.decode(raws[2])
    longer = dataclasses.replace(frags[0], rewards=np.zeros((T + 1, N), np.float32))  # a new shape: a new layout
    raw = pack_fragment(longer, actor)[0]
    assert raw != raws[0] and unpack_fragment((raw, *pack_fragment(longer, actor)[1:]), driver).rewards.shape == (T + 1, N)
