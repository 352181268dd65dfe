"""Minari datasets: what polar writes Minari reads; bad datasets fail at load with the field named."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from polar.datasets.minari import DatasetError, load_dataset
from tests.datasets.offline_data import cartpole_expert, play, write


@pytest.fixture
def cartpole_ds(tmp_path):
    return write(tmp_path / "cartpole-expert-v0", "CartPole-v1", play("CartPole-v1", 3, cartpole_expert, max_steps=50))


def test_minari_reads_what_polar_writes(cartpole_ds, monkeypatch, tmp_path):
    minari = pytest.importorskip("minari")
    ds = minari.MinariDataset(cartpole_ds / "data")
    assert ds.total_episodes == 3 and ds.total_steps == 150
    assert ds.observation_space.shape == (4,) and int(ds.action_space.n) == 2
    ep = next(iter(ds.iterate_episodes([1])))
    assert ep.observations.shape == (51, 4) and ep.actions.shape == (50,)
    assert bool(ep.truncations[-1]) and not ep.terminations.any()
    # by id from the local datasets folder
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    assert minari.load_dataset("cartpole-expert-v0").total_steps == 150
    ours = load_dataset("cartpole-expert-v0")
    assert len(ours) == 150 and ours.dataset_id == "cartpole-expert-v0"
    np.testing.assert_allclose(ours.obs[50:100], ep.observations[:-1])  # episode 0 has 50 steps
    np.testing.assert_allclose(ours.next_obs[99], ep.observations[-1])


def test_pendulum_box_actions_round_trip(tmp_path):
    path = write(tmp_path / "pendulum-random-v0", "Pendulum-v1", play("Pendulum-v1", 2, None, max_steps=20))
    data = load_dataset(path)
    assert data.actions.shape == (40, 1) and data.terminated.sum() == 0
    minari = pytest.importorskip("minari")
    assert minari.MinariDataset(path / "data").action_space.shape == (1,)


def _edit(ds, fn):
    with h5py.File(ds / "data" / "main_data.hdf5", "a") as f:
        fn(f)


def test_missing_field_is_named(cartpole_ds):
    _edit(cartpole_ds, lambda f: f["episode_1"].__delitem__("rewards"))
    with pytest.raises(DatasetError, match=r"episode_1/rewards is missing"):
        load_dataset(cartpole_ds)


def test_truncated_episode_is_named(cartpole_ds):
    def cut(f):
        obs = f["episode_2/observations"][()]
        del f["episode_2/observations"]
        f["episode_2"].create_dataset("observations", data=obs[:-5])
    _edit(cartpole_ds, cut)
    with pytest.raises(DatasetError, match=r"episode_2/observations has 46 rows for 50 steps.*truncated"):
        load_dataset(cartpole_ds)


def test_episode_cut_off_without_an_end(cartpole_ds):
    def unmark(f):
        f["episode_0/truncations"][-1] = False
    _edit(cartpole_ds, unmark)
    with pytest.raises(DatasetError, match=r"episode_0 stops after 50 steps without terminations or truncations"):
        load_dataset(cartpole_ds)


def test_mismatched_spaces_and_metadata(cartpole_ds, tmp_path):
    import gymnasium as gym

    with pytest.raises(DatasetError, match=r"policy.kwargs.dataset: the dataset's observation_space is Box.*env's is"):
        load_dataset(cartpole_ds, observation_space=gym.spaces.Box(-1, 1, (3,)), where="policy.kwargs.dataset")
    with pytest.raises(DatasetError, match=r"action_space"):
        load_dataset(cartpole_ds, action_space=gym.spaces.Discrete(3))
    meta = json.loads((cartpole_ds / "data" / "metadata.json").read_text())
    del meta["action_space"]
    (cartpole_ds / "data" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"metadata has no 'action_space'"):
        load_dataset(cartpole_ds)
    with pytest.raises(DatasetError, match=r"dataset 'nope-v0' not found.*nothing is downloaded"):
        load_dataset("nope-v0", base=tmp_path)
