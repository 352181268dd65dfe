"""Off-policy replay: a uniform ring buffer and proportional prioritized replay over a sum tree.

Transitions live in preallocated numpy arrays (``np.zeros``, so untouched capacity costs no memory
until it is written). ``next_obs`` is stored explicitly next to ``obs`` (SB3 with
``optimize_memory_usage=False``): it doubles observation memory but stays correct across episode
ends, fragment boundaries and workers, where the next slot is not the next observation.

Buffers are saved as one ``.npz`` of plain arrays (no pickles) with a JSON header, written atomically,
so a resumed run samples exactly what an uninterrupted one would.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch

from polar.errors import CheckpointError, ConfigError
from polar.types import Fragment

FORMAT_VERSION = 2  # 2: per-transition ``steps`` (n-step returns)
_OBS_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)


@dataclass
class ReplayBatch:
    """A sampled batch, first axis B. ``terminated`` is 1.0 only for true terminals (truncation bootstraps)."""

    obs: torch.Tensor | dict[str, torch.Tensor]
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor | dict[str, torch.Tensor]
    terminated: torch.Tensor
    weights: torch.Tensor
    steps: torch.Tensor  # [B] float32: env steps the transition spans; the bootstrap discount is gamma ** steps
    indices: np.ndarray

    def to(self, device: torch.device) -> ReplayBatch:
        """The batch on ``device`` (the learner's); itself on CPU. ``indices`` stay a numpy array."""
        if device.type == "cpu":
            return self

        def move(x: Any) -> Any:
            if isinstance(x, dict):
                return {k: v.to(device, non_blocking=True) for k, v in x.items()}
            return x.to(device, non_blocking=True)

        return ReplayBatch(obs=move(self.obs), actions=move(self.actions), rewards=move(self.rewards),
                           next_obs=move(self.next_obs), terminated=move(self.terminated), weights=move(self.weights),
                           steps=move(self.steps), indices=self.indices)


def _obs_spec(space: gym.Space, where: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, storage dtype) of one observation; float Boxes are stored as float32."""
    if not isinstance(space, _OBS_SPACES):
        raise ConfigError(f"replay buffers store Box, Discrete, MultiBinary, MultiDiscrete or Dict observations "
                          f"(a Dict of those); {where} is {space}")
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(space.shape), np.dtype(np.int64)
    dtype = np.dtype(np.float32) if np.issubdtype(space.dtype, np.floating) else np.dtype(space.dtype)
    return tuple(space.shape), dtype


def _action_spec(space: gym.Space) -> tuple[tuple[int, ...], np.dtype]:
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    if isinstance(space, gym.spaces.Box):
        return tuple(space.shape), np.dtype(np.float32)
    raise ConfigError(f"replay buffers store Discrete or Box actions (DQN needs a Discrete action space, SAC a Box "
                      f"one); got {space}. Use an on-policy algorithm (ppo, appo) for this action space")


ObsInput: TypeAlias = "npt.ArrayLike | dict[str, npt.ArrayLike]"
Mismatch = Callable[[str], CheckpointError]


def _spec_json(shape: tuple[int, ...], dtype: np.dtype) -> list[object]:
    return [list(shape), dtype.str]


class ReplayBuffer:
    """Ring buffer of transitions in preallocated numpy arrays, sampled uniformly with replacement.

    ``add`` takes a batch of B transitions (first axis B); once full, the oldest are overwritten.
    """

    def __init__(self, capacity: int, observation_space: gym.Space, action_space: gym.Space, seed: int = 0) -> None:
        if int(capacity) != capacity or capacity < 1:
            raise ValueError(f"replay buffer capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self.observation_space = observation_space
        self.action_space = action_space
        self._action_spec = _action_spec(action_space)
        if isinstance(observation_space, gym.spaces.Dict):
            self._is_dict = True
            self._obs_specs = {k: _obs_spec(s, f"observation key {k!r}") for k, s in observation_space.spaces.items()}
        else:
            self._is_dict = False
            self._obs_specs = {"": _obs_spec(observation_space, "the observation space")}
        cap = self.capacity
        self._obs = {k: np.zeros((cap, *shape), dtype) for k, (shape, dtype) in self._obs_specs.items()}
        self._next_obs = {k: np.zeros((cap, *shape), dtype) for k, (shape, dtype) in self._obs_specs.items()}
        act_shape, act_dtype = self._action_spec
        self._actions = np.zeros((cap, *act_shape), act_dtype)
        self._rewards: np.ndarray = np.zeros(cap, np.float32)
        self._terminated: np.ndarray = np.zeros(cap, np.float32)
        self._steps: np.ndarray = np.zeros(cap, np.float32)
        self.pos = 0  # next slot to write
        self.size = 0
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    # ---- adding ----------------------------------------------------------------------------------------

    def _fields(self) -> dict[str, np.ndarray]:
        """Storage arrays by their file name: ``obs``/``next_obs`` (or ``obs:<key>`` for Dict spaces), ..."""
        out: dict[str, np.ndarray] = {}
        for name, store in (("obs", self._obs), ("next_obs", self._next_obs)):
            for k, arr in store.items():
                out[f"{name}:{k}" if self._is_dict else name] = arr
        out.update(actions=self._actions, rewards=self._rewards, terminated=self._terminated, steps=self._steps)
        return out

    def _split_obs(self, obs: ObsInput, name: str) -> dict[str, npt.ArrayLike]:
        if self._is_dict:
            if not isinstance(obs, dict) or set(obs) != set(self._obs_specs):
                got = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
                raise ValueError(f"{name} must be a dict with keys {sorted(self._obs_specs)}, got {got}")
            return {f"{name}:{k}": obs[k] for k in self._obs_specs}
        if isinstance(obs, dict):
            raise ValueError(f"{name} is a dict but the observation space is {self.observation_space}")
        return {name: obs}

    def add(self, obs: ObsInput, actions: npt.ArrayLike, rewards: npt.ArrayLike, next_obs: ObsInput,
            terminated: npt.ArrayLike, steps: npt.ArrayLike | None = None) -> None:
        """Append B transitions (first axis B); ``obs``/``next_obs`` are dicts of arrays for Dict spaces.

        ``steps`` (default 1 each): how many env steps a transition spans, for n-step returns, where
        ``rewards`` is the discounted sum over those steps and ``next_obs`` the observation after them."""
        if steps is None:
            steps = np.ones(np.shape(rewards)[:1], np.float32)
        given = {**self._split_obs(obs, "obs"), **self._split_obs(next_obs, "next_obs"),
                 "actions": actions, "rewards": rewards, "terminated": terminated, "steps": steps}
        stores = self._fields()
        batch: dict[str, np.ndarray] = {}
        n: int | None = None
        for name, given_value in given.items():
            value = np.asarray(given_value)
            store = stores[name]
            if n is None:
                n = value.shape[0] if value.ndim else -1
            if value.shape != (n, *store.shape[1:]):
                raise ValueError(f"replay add: {name} has shape {value.shape}, expected ({n}, "
                                 f"{', '.join(map(str, store.shape[1:]))}) ([B, ...] with one B for all fields)")
            if not np.can_cast(value.dtype, store.dtype, "same_kind"):
                raise ValueError(f"replay add: {name} has dtype {value.dtype}, which does not cast safely to the "
                                 f"stored {store.dtype}")
            batch[name] = value
        if n is None or n == 0:  # n is None only for no fields, which `given` never is
            return
        if n > self.capacity:  # only the newest `capacity` survive; write just those
            start = (self.pos + n - self.capacity) % self.capacity
            batch = {k: v[n - self.capacity:] for k, v in batch.items()}
            m = self.capacity
        else:
            start, m = self.pos, n
        first = min(m, self.capacity - start)
        for name, value in batch.items():
            store = stores[name]
            store[start:start + first] = value[:first]
            store[:m - first] = value[first:]
        self._on_add(np.arange(start, start + m) % self.capacity)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def add_fragment(self, frag: Fragment) -> int:
        """Add a rollout ``Fragment``'s T*N transitions in time order (t-major); returns how many were added."""
        next_obs = getattr(frag, "next_obs", None)
        if next_obs is None:
            raise ValueError("fragment has no next_obs: off-policy learners need the rollout runner to record "
                             "next observations (keep_next_obs)")
        T, N = frag.rewards.shape[:2]

        def flat(given: npt.ArrayLike) -> np.ndarray:
            x = np.asarray(given)
            if x.shape[:2] != (T, N):
                raise ValueError(f"fragment array has shape {x.shape}, expected [T={T}, N={N}, ...]")
            return x.reshape(T * N, *x.shape[2:])

        def flat_obs(o: ObsInput) -> ObsInput:
            return {k: flat(v) for k, v in o.items()} if isinstance(o, dict) else flat(o)

        self.add(flat_obs(frag.obs), flat(frag.actions), flat(frag.rewards), flat_obs(next_obs), flat(frag.terminated))
        return T * N

    def _on_add(self, slots: np.ndarray) -> None:
        """Hook for subclasses: ``slots`` were just (over)written."""

    # ---- sampling --------------------------------------------------------------------------------------

    def sample(self, batch_size: int, beta: float | None = None) -> ReplayBatch:
        """``batch_size`` transitions with replacement (``beta`` is ignored by the uniform buffer)."""
        if int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if self.size == 0:
            raise ValueError("replay buffer is empty: collect at least one transition (learning_starts) before sampling")
        indices, weights = self._sample_indices(int(batch_size), beta)
        return self._gather(indices, weights)

    def take(self, indices: np.ndarray) -> ReplayBatch:
        """The stored transitions at slots ``indices`` (each in ``[0, len)``), weights 1: a whole-buffer pass (a
        model fit) rather than a sample."""
        indices = np.asarray(indices, np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.size):
            raise ValueError(f"replay take: slots must be in [0, {self.size}), got {indices.min()}..{indices.max()}")
        return self._gather(indices, np.ones(len(indices), np.float32))

    def _sample_indices(self, batch_size: int, beta: float | None) -> tuple[np.ndarray, np.ndarray]:
        indices = self.rng.integers(0, self.size, size=batch_size, dtype=np.int64)
        return indices, np.ones(batch_size, np.float32)

    def _gather(self, indices: np.ndarray, weights: np.ndarray) -> ReplayBatch:
        def take(store: dict[str, np.ndarray]) -> torch.Tensor | dict[str, torch.Tensor]:
            out = {k: torch.from_numpy(v[indices]) for k, v in store.items()}
            return out if self._is_dict else out[""]

        return ReplayBatch(
            obs=take(self._obs),
            actions=torch.from_numpy(self._actions[indices]),
            rewards=torch.from_numpy(self._rewards[indices]),
            next_obs=take(self._next_obs),
            terminated=torch.from_numpy(self._terminated[indices]),
            weights=torch.from_numpy(weights),
            indices=indices,
            steps=torch.from_numpy(self._steps[indices]),
        )

    # ---- save / load -----------------------------------------------------------------------------------

    def _header(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "kind": type(self).__name__,
            "capacity": self.capacity,
            "pos": self.pos,
            "size": self.size,
            "obs": {k: _spec_json(*spec) for k, spec in self._obs_specs.items()},
            "obs_is_dict": self._is_dict,
            "action": _spec_json(*self._action_spec),
            "rng": self.rng.bit_generator.state,
        }

    def _extra_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def save(self, path: str | Path) -> None:
        """Write the buffer to ``path`` atomically (``<path>.tmp``, fsync, ``os.replace``): old or new, never half."""
        path = Path(path)
        arrays = {name: arr[:self.size] for name, arr in self._fields().items()}
        arrays.update(self._extra_arrays())
        arrays["header"] = np.array(json.dumps(self._header()))
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:  # a file object, so np.savez does not append ".npz"
            np.savez(f, allow_pickle=False, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def load(self, path: str | Path) -> None:
        """Restore a buffer saved by ``save``; it must match this buffer's capacity, spaces and kind.

        Everything is validated before anything is written, so a failed load leaves the buffer as it was.
        """
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"replay buffer file {path} does not exist")
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
            header = json.loads(str(data.pop("header")[()]))
            if not isinstance(header, dict):
                raise ValueError("the header is not a JSON object")
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as e:
            raise CheckpointError(f"replay buffer file {path} is unreadable ({type(e).__name__}: {e}); it may be "
                                  f"truncated or not a polar replay buffer") from None

        def mismatch(what: str) -> CheckpointError:
            return CheckpointError(f"replay buffer file {path} does not match this buffer: {what}. Was it saved for "
                                   f"a different env or buffer config? Delete it or restore the matching config")

        mine = self._header()
        if header.get("format") != FORMAT_VERSION:
            raise mismatch(f"format {header.get('format')!r} in the file, {FORMAT_VERSION} here")
        for key, label in (("kind", "buffer type"), ("capacity", "capacity"), ("obs_is_dict", "Dict observations")):
            if header.get(key) != mine[key]:
                raise mismatch(f"{label} is {header.get(key)!r} in the file but {mine[key]!r} here")
        file_obs = header.get("obs", {})
        if set(file_obs) != set(mine["obs"]):
            raise mismatch(f"observation keys are {sorted(file_obs)} in the file but {sorted(mine['obs'])} here")
        for k, spec in mine["obs"].items():
            if file_obs[k] != spec:
                name = f"observation {k!r}" if self._is_dict else "the observation"
                raise mismatch(f"{name} has (shape, dtype) {tuple(file_obs[k][0]), file_obs[k][1]} in the file "
                               f"but {tuple(spec[0]), spec[1]} here")
        if header.get("action") != mine["action"]:
            fa = header.get("action") or [[], "?"]
            raise mismatch(f"actions have (shape, dtype) {tuple(fa[0]), fa[1]} in the file but "
                           f"{tuple(mine['action'][0]), mine['action'][1]} here")
        size, pos = header.get("size"), header.get("pos")
        if not (isinstance(size, int) and isinstance(pos, int) and 0 <= size <= self.capacity
                and 0 <= pos < self.capacity and (size == self.capacity or pos == size)):
            raise mismatch(f"position {pos!r} / size {size!r} are inconsistent with capacity {self.capacity}")
        expected = {name: ((size, *arr.shape[1:]), arr.dtype) for name, arr in self._fields().items()}
        expected.update(self._extra_expected(size))
        for name, (shape, dtype) in expected.items():
            if name not in data:
                raise mismatch(f"array {name!r} is missing")
            if data[name].shape != shape or data[name].dtype != dtype:
                raise mismatch(f"array {name!r} has shape {data[name].shape} and dtype {data[name].dtype} in the "
                               f"file, expected {shape} and {dtype}")
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = header["rng"]
        except (KeyError, TypeError, ValueError) as e:
            raise mismatch(f"its RNG state does not restore into {type(self.rng.bit_generator).__name__} ({e})") from None
        self._check_extra(header, data, mismatch)

        for name, arr in self._fields().items():
            arr[:size] = data[name]
            arr[size:] = 0
        self.pos, self.size = pos, size
        self.rng = rng
        self._load_extra(header, data)

    def _extra_expected(self, size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {}

    def _check_extra(self, header: dict[str, Any], data: dict[str, np.ndarray], mismatch: Mismatch) -> None:
        pass

    def _load_extra(self, header: dict[str, Any], data: dict[str, np.ndarray]) -> None:
        pass


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) over a sum tree: P(i) ~ p_i^alpha.

    The tree is one float64 array: node 1 is the root, node i has children 2i and 2i+1, and slot s is
    the leaf ``cap_pow2 + s``. Every parent is recomputed as left + right after a change, so the tree
    is an exact function of its leaves. New transitions get the largest priority seen so far.
    """

    def __init__(self, capacity: int, observation_space: gym.Space, action_space: gym.Space, seed: int = 0,
                 alpha: float = 0.6, eps: float = 1e-6) -> None:
        super().__init__(capacity, observation_space, action_space, seed)
        if not (np.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"prioritized replay alpha must be >= 0 (0 = uniform), got {alpha!r}")
        if not (np.isfinite(eps) and eps > 0):
            raise ValueError(f"prioritized replay eps must be > 0 (keeps every transition sampleable), got {eps!r}")
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.cap_pow2 = 1 << (self.capacity - 1).bit_length()
        self.depth = self.cap_pow2.bit_length() - 1
        self.tree: np.ndarray = np.zeros(2 * self.cap_pow2, np.float64)
        self.priorities: np.ndarray = np.zeros(self.capacity, np.float64)  # raw p = |td| + eps, before ** alpha
        self.max_priority = 1.0

    @property
    def total_priority(self) -> float:
        """Sum of p_i^alpha over stored transitions (the tree's root)."""
        return float(self.tree[1])

    def _set_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set raw priorities of distinct ``slots``, then recompute their ancestors level by level.

        A parent reached from two slots is written twice with the same value (its children are final
        by then), so the levels need no dedupe.
        """
        self.priorities[slots] = priorities
        nodes: np.ndarray = slots + self.cap_pow2
        tree = self.tree
        tree[nodes] = priorities ** self.alpha
        for _ in range(self.depth):
            nodes >>= 1
            left = nodes << 1
            tree[nodes] = tree[left] + tree[left + 1]

    def _rebuild_tree(self, leaves: np.ndarray) -> None:
        """Set the first ``len(leaves)`` leaves and recompute every parent as left + right."""
        self.tree[:] = 0.0
        self.tree[self.cap_pow2:self.cap_pow2 + len(leaves)] = leaves
        lo = self.cap_pow2 // 2
        while lo >= 1:
            self.tree[lo:2 * lo] = self.tree[2 * lo:4 * lo:2] + self.tree[2 * lo + 1:4 * lo:2]
            lo //= 2

    def _on_add(self, slots: np.ndarray) -> None:
        self._set_priorities(slots.astype(np.int64), np.full(len(slots), self.max_priority))

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Set p = |td| + eps for sampled ``indices`` (from ``ReplayBatch.indices``)."""
        indices = np.asarray(indices).reshape(-1)
        td = np.asarray(td_errors, dtype=np.float64).reshape(-1)
        if indices.shape != td.shape:
            raise ValueError(f"update_priorities: {indices.size} indices but {td.size} td_errors")
        if not np.issubdtype(indices.dtype, np.integer):
            raise ValueError(f"update_priorities: indices must be integers, got dtype {indices.dtype}")
        bad = ~np.isfinite(td)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"update_priorities: td_errors[{i}] = {td[i]} (slot {indices[i]}) is not finite; "
                             f"check the loss for NaN/inf before updating priorities")
        out = (indices < 0) | (indices >= self.size)
        if out.any():
            i = int(np.argmax(out))
            raise ValueError(f"update_priorities: indices[{i}] = {indices[i]} is outside the {self.size} stored "
                             f"transitions")
        if indices.size == 0:
            return
        priorities = np.abs(td) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        # a slot given twice keeps its last value
        slots, last = np.unique(indices[::-1].astype(np.int64), return_index=True)
        self._set_priorities(slots, priorities[::-1][last])

    def _sample_indices(self, batch_size: int, beta: float | None) -> tuple[np.ndarray, np.ndarray]:
        """Stratified: one uniform draw in each of ``batch_size`` equal segments of the total mass."""
        if beta is None or not (0.0 <= beta <= 1.0):
            raise ValueError(f"prioritized replay needs beta in [0, 1] for its importance weights (anneal it to 1), "
                             f"got {beta!r}")
        tree = self.tree
        total = tree[1]
        mass = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        nodes: np.ndarray = np.ones(batch_size, np.int64)
        for _ in range(self.depth):
            left = nodes << 1
            left_mass: np.ndarray = tree.take(left)
            # never enter a zero-mass subtree, even when rounding pushes `mass` past the last leaf
            go_right = (mass >= left_mass) & (tree.take(left + 1) > 0)
            mass -= left_mass * go_right
            nodes = left + go_right
        probs = tree.take(nodes) / total
        weights = (self.size * probs) ** (-beta)
        weights = (weights / weights.max()).astype(np.float32)
        return nodes - self.cap_pow2, weights

    def _header(self) -> dict[str, Any]:
        return {**super()._header(), "alpha": self.alpha, "max_priority": self.max_priority}

    def _extra_arrays(self) -> dict[str, np.ndarray]:
        leaves = self.tree[self.cap_pow2:self.cap_pow2 + self.size]
        return {"priorities": self.priorities[:self.size], "tree_leaves": leaves}

    def _extra_expected(self, size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {"priorities": ((size,), np.dtype(np.float64)), "tree_leaves": ((size,), np.dtype(np.float64))}

    def _check_extra(self, header: dict[str, Any], data: dict[str, np.ndarray], mismatch: Mismatch) -> None:
        mp = header.get("max_priority")
        if not isinstance(mp, (int, float)) or not np.isfinite(mp) or mp <= 0:
            raise mismatch(f"max_priority {mp!r} is not a positive number")
        for name in ("priorities", "tree_leaves"):
            arr = data[name]
            if arr.size and not (np.isfinite(arr).all() and (arr >= 0).all()):
                raise mismatch(f"its {name} are not all finite and non-negative")

    def _load_extra(self, header: dict[str, Any], data: dict[str, np.ndarray]) -> None:
        """Same alpha: the saved leaves, so the tree (and sampling) is bit-identical. Another alpha: p ** alpha."""
        self.priorities[:] = 0.0
        self.priorities[:self.size] = data["priorities"]
        self.max_priority = float(header["max_priority"])
        same_alpha = header.get("alpha") == self.alpha
        self._rebuild_tree(data["tree_leaves"] if same_alpha else data["priorities"] ** self.alpha)
