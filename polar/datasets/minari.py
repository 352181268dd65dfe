"""Minari datasets on disk, written and read with h5py (no ``minari`` import, no jax).

A dataset is a folder ``<root>/<dataset_id>/data/`` holding ``metadata.json`` and ``main_data.hdf5``; the HDF5
file has one group ``episode_<id>`` per episode with ``observations`` (T+1 rows: the last is the final
observation), ``actions``, ``rewards``, ``terminations`` and ``truncations`` (T rows) and an ``infos`` group; its
attributes are ``id`` and ``total_steps``. ``metadata.json`` names the dataset (``dataset_id``), the Minari
format version, the counts and both spaces in Minari's JSON space encoding. ``minari.load_dataset`` reads what
:func:`write_dataset` writes (tests/datasets/test_minari.py checks it).

:func:`load_dataset` checks everything before training starts: a missing file, key or episode field, an
episode whose lengths disagree or that stops without ending (neither terminated nor truncated), and spaces
other than the env's all fail with one line naming the field.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from polar.errors import ConfigError

log = logging.getLogger(__name__)

MINARI_VERSION = "0.4.3"  # the format version Minari 0.4.x/0.5.x read (``minari.supported_dataset_versions``)
DATASET_ID_RE = re.compile(r"(?:[\w@.-]+/)*[\w@.-]+-v\d+")
EPISODE_FIELDS = ("observations", "actions", "rewards", "terminations", "truncations")
REQUIRED_METADATA = ("dataset_id", "minari_version", "data_format", "total_episodes", "total_steps",
                     "observation_space", "action_space")


class DatasetError(ConfigError):
    """A dataset that cannot be trained on: named file, field and fix."""


@dataclass
class Episode:
    """One episode: ``observations`` has one row more than the others (the final observation)."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    seed: int | None = None


@dataclass
class Transitions:
    """A dataset flattened to transitions; ``terminated`` is 1.0 where the episode ended for real (no bootstrap)."""

    dataset_id: str
    observation_space: gym.Space
    action_space: gym.Space
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    episode_returns: list[float]

    def __len__(self) -> int:
        return int(self.rewards.shape[0])


# ---------------------------------------------------------------------- spaces (Minari's JSON encoding)
def serialize_space(space: gym.Space) -> str:
    if isinstance(space, gym.spaces.Box):
        return json.dumps({"type": "Box", "dtype": str(space.dtype), "shape": list(space.shape),
                           "low": space.low.tolist(), "high": space.high.tolist()})
    if isinstance(space, gym.spaces.Discrete):
        return json.dumps({"type": "Discrete", "dtype": "int64", "start": int(space.start), "n": int(space.n)})
    raise DatasetError(f"datasets hold Box or Discrete spaces; {space} is neither")


def deserialize_space(text: Any, where: str) -> gym.Space:
    try:
        spec = json.loads(text) if isinstance(text, str) else dict(text)
        kind = spec["type"]
        if kind == "Box":
            return gym.spaces.Box(low=np.asarray(spec["low"], dtype=spec["dtype"]),
                                  high=np.asarray(spec["high"], dtype=spec["dtype"]),
                                  shape=tuple(spec["shape"]), dtype=spec["dtype"])
        if kind == "Discrete":
            return gym.spaces.Discrete(int(spec["n"]), start=int(spec.get("start", 0)))
    except (ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"{where}: not a Minari space encoding ({type(e).__name__}: {e})") from None
    raise DatasetError(f"{where}: space type {kind!r} is not supported; polar trains offline on Box or Discrete")


def same_space(a: gym.Space, b: gym.Space) -> bool:
    if isinstance(a, gym.spaces.Discrete) and isinstance(b, gym.spaces.Discrete):
        return int(a.n) == int(b.n) and int(a.start) == int(b.start)
    if isinstance(a, gym.spaces.Box) and isinstance(b, gym.spaces.Box):
        return a.shape == b.shape and bool(np.allclose(a.low, b.low)) and bool(np.allclose(a.high, b.high))
    return False


# ---------------------------------------------------------------------- where a dataset lives
def datasets_root() -> Path:
    """Minari's local datasets folder: ``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``."""
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env) if env else Path.home() / ".minari" / "datasets"


def resolve_dataset(ref: str | Path, base: Path | None = None) -> Path:
    """The ``data/`` folder of a dataset given by path (the dataset folder or its ``data/``; relative to
    ``base``) or by id (``name-v0``, under :func:`datasets_root`). Nothing is downloaded."""
    text = str(ref)
    candidates = [Path(text)] if Path(text).is_absolute() else [(base or Path.cwd()) / text, Path.cwd() / text]
    if DATASET_ID_RE.fullmatch(text):
        candidates.append(datasets_root() / text)
    for c in candidates:
        for data in (c / "data", c):
            if (data / "metadata.json").is_file():
                return data
    tried = ", ".join(str(c) for c in dict.fromkeys(candidates))
    raise DatasetError(f"dataset {text!r} not found (looked in {tried}); give a dataset folder (with data/metadata.json) "
                       "or a local Minari id under MINARI_DATASETS_PATH; polar collect writes one, nothing is downloaded")


# ---------------------------------------------------------------------- write
def write_dataset(out: str | Path, episodes: Iterable[Episode], observation_space: gym.Space, action_space: gym.Space,
                  dataset_id: str | None = None, env_id: str | None = None, **extra: Any) -> Path:
    """Write ``episodes`` as a Minari dataset in folder ``out`` (``out/data/...``); returns ``out``.
    ``dataset_id`` defaults to the folder name, which must then look like ``name-v0``."""
    import h5py

    out = Path(out)
    dataset_id = dataset_id or out.name
    if not DATASET_ID_RE.fullmatch(dataset_id):
        raise DatasetError(f"dataset id {dataset_id!r} is not a Minari id; name it like 'cartpole-expert-v0' "
                           "(namespace/name-v<version>)")
    data_dir = out / "data"
    if (data_dir / "main_data.hdf5").exists():
        raise DatasetError(f"{data_dir} already holds a dataset; pick another --out or delete it first")
    data_dir.mkdir(parents=True, exist_ok=True)
    obs_text, act_text = serialize_space(observation_space), serialize_space(action_space)
    total_steps, total_episodes = 0, 0
    with h5py.File(data_dir / "main_data.hdf5", "w", track_order=True) as f:
        for ep in episodes:
            steps = len(ep.rewards)
            if ep.observations.shape[0] != steps + 1:
                raise DatasetError(f"episode {total_episodes}: {ep.observations.shape[0]} observations for {steps} "
                                   "steps; an episode has one observation more than steps (the final one)")
            g = f.create_group(f"episode_{total_episodes}")
            g.attrs["id"] = total_episodes
            g.attrs["total_steps"] = steps
            if ep.seed is not None:
                g.attrs["seed"] = int(ep.seed)
            g.create_dataset("observations", data=ep.observations)
            g.create_dataset("actions", data=ep.actions)
            g.create_dataset("rewards", data=np.asarray(ep.rewards, dtype=np.float64))
            g.create_dataset("terminations", data=np.asarray(ep.terminations, dtype=bool))
            g.create_dataset("truncations", data=np.asarray(ep.truncations, dtype=bool))
            g.create_group("infos")
            total_steps += steps
            total_episodes += 1
    meta = {"dataset_id": dataset_id, "minari_version": MINARI_VERSION, "data_format": "hdf5",
            "total_episodes": total_episodes, "total_steps": total_steps,
            "observation_space": obs_text, "action_space": act_text,
            "dataset_size": round((data_dir / "main_data.hdf5").stat().st_size / 1e6, 3), **extra}
    if env_id is not None and env_id in gym.registry:
        try:  # Minari rebuilds the env from it (dataset.recover_environment())
            meta["env_spec"] = gym.spec(env_id).to_json()
        except (ValueError, TypeError) as e:
            log.warning("env %s: its spec is not JSON-serializable (%s); the dataset names no env_spec", env_id, e)
    (data_dir / "metadata.json").write_text(json.dumps(meta, indent=2))
    return out


# ---------------------------------------------------------------------- read
def read_metadata(data_dir: Path) -> dict[str, Any]:
    path = data_dir / "metadata.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: unreadable metadata ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"{path}: metadata must be a JSON object")
    for key in REQUIRED_METADATA:
        if key not in meta:
            raise DatasetError(f"{path}: metadata has no {key!r}; a Minari dataset names {', '.join(REQUIRED_METADATA)}")
    if meta["data_format"] != "hdf5":
        raise DatasetError(f"{path}: data_format {meta['data_format']!r}; polar reads Minari's hdf5 datasets")
    return meta


def load_dataset(ref: str | Path, base: Path | None = None, observation_space: gym.Space | None = None,
                 action_space: gym.Space | None = None, where: str = "dataset") -> Transitions:
    """Every transition of a dataset, checked. ``observation_space`` / ``action_space`` (the env's), when
    given, must be the dataset's; ``where`` is the config key the errors name."""
    import h5py

    data_dir = resolve_dataset(ref, base)
    meta = read_metadata(data_dir)
    obs_space = deserialize_space(meta["observation_space"], f"{where}: metadata observation_space")
    act_space = deserialize_space(meta["action_space"], f"{where}: metadata action_space")
    for name, mine, env in (("observation_space", obs_space, observation_space), ("action_space", act_space, action_space)):
        if env is not None and not same_space(mine, env):
            raise DatasetError(f"{where}: the dataset's {name} is {mine} but the env's is {env}; "
                               "train on a dataset collected on this env (polar collect)")
    path = data_dir / "main_data.hdf5"
    if not path.is_file():
        raise DatasetError(f"{where}: {path} is missing; a Minari dataset keeps its episodes there")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "actions", "rewards", "next_obs", "terminated")}
    returns: list[float] = []
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(f"{where}: {path} is not a readable HDF5 file ({e})") from None
    with f:
        names = sorted((k for k in f if k.startswith("episode_")), key=lambda k: int(k.split("_", 1)[1]))
        if len(names) != int(meta["total_episodes"]):
            raise DatasetError(f"{where}: metadata says {meta['total_episodes']} episodes but {path} holds {len(names)}")
        for name in names:
            g = f[name]
            for field in EPISODE_FIELDS:
                if field not in g or not isinstance(g[field], h5py.Dataset):
                    raise DatasetError(f"{where}: {name}/{field} is missing in {path}; every episode needs "
                                       f"{', '.join(EPISODE_FIELDS)}")
            ep = {field: g[field][()] for field in EPISODE_FIELDS}
            steps = ep["rewards"].shape[0]
            for field in ("actions", "terminations", "truncations"):
                if ep[field].shape[0] != steps:
                    raise DatasetError(f"{where}: {name}/{field} has {ep[field].shape[0]} rows but {name}/rewards has "
                                       f"{steps}; the episode is truncated or corrupt")
            if ep["observations"].shape[0] != steps + 1:
                raise DatasetError(f"{where}: {name}/observations has {ep['observations'].shape[0]} rows for {steps} "
                                   f"steps (needs {steps + 1}: the final observation too); the episode is truncated")
            if steps == 0:
                raise DatasetError(f"{where}: {name} has no steps")
            if not (ep["terminations"][-1] or ep["truncations"][-1]):
                raise DatasetError(f"{where}: {name} stops after {steps} steps without terminations or truncations at "
                                   "its last step; the episode was cut off (re-collect it, or mark its end truncated)")
            obs = ep["observations"]
            if obs.shape[1:] != obs_space.shape:
                raise DatasetError(f"{where}: {name}/observations rows have shape {obs.shape[1:]} but the dataset's "
                                   f"observation_space is {obs_space}")
            if ep["actions"].shape[1:] != act_space.shape:
                raise DatasetError(f"{where}: {name}/actions rows have shape {ep['actions'].shape[1:]} but the "
                                   f"dataset's action_space is {act_space}")
            parts["obs"].append(obs[:-1])
            parts["next_obs"].append(obs[1:])
            parts["actions"].append(ep["actions"])
            parts["rewards"].append(ep["rewards"].astype(np.float32))
            parts["terminated"].append(ep["terminations"].astype(np.float32))
            returns.append(float(ep["rewards"].sum()))
    if not returns:
        raise DatasetError(f"{where}: {path} holds no episodes")
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    if not (np.isfinite(cat["obs"]).all() and np.isfinite(cat["next_obs"]).all() and np.isfinite(cat["rewards"]).all()):
        raise DatasetError(f"{where}: {path} holds NaN or inf observations or rewards")
    return Transitions(str(meta["dataset_id"]), obs_space, act_space, cat["obs"].astype(np.float32),
                       cat["actions"], cat["rewards"], cat["next_obs"].astype(np.float32), cat["terminated"], returns)
