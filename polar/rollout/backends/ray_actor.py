"""The rollout worker as a Ray actor: ``envs_per_worker`` env copies stepped by one ``EnvRunner``.

It is the same ``EnvRunner`` the local backend runs in its worker processes; only the transport
differs. Weights ride with a ``sample`` call only when the worker does not have that version yet:
inline in the call when small (a put into the object store costs more than the bytes), else as one
object-store reference shared by every worker, which Ray resolves to zero-copy numpy arrays before
the call runs (``polar.rollout.backends.ray_pool``).

Inline weights and every fragment travel packed: the arrays' bytes in one ``bytes`` object plus a
small layout (``pack_arrays``). Ray serializes a dict of numpy arrays array by array, each with its
own pickle-5 buffer and header; with a CartPole policy's 12 tensors inline in a call and a fragment's
10 arrays in its reply that cost the driver and the actor ~0.35 ms of CPU each per call on the 2-core
box, about as much as the rest of the call (docs/benchmarks.md, "Ray's tax on one machine").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polar.types import Fragment

#: One packed array: (name, sub-key or None, numpy dtype string, shape, byte offset in the buffer).
ArrayEntry = tuple[str, str | None, str, tuple[int, ...], int]
#: Arrays packed into one buffer: their layout and their bytes (``pack_arrays``).
PackedArrays = tuple[tuple[ArrayEntry, ...], bytes]
#: A fragment on the wire: its packed arrays and its other fields as they are (``pack_fragment``).
PackedFragment = tuple[tuple[ArrayEntry, ...], bytes, dict[str, Any]]

_ALIGN = 16  # every array starts 16-byte aligned in the buffer, as numpy and torch kernels like it


def state_to_numpy(state_dict: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A state dict as plain numpy arrays: zero-copy in Ray's object store, no torch pickling."""
    return {k: v.detach().cpu().numpy() for k, v in state_dict.items()}


def _packable(a: object) -> bool:
    return isinstance(a, np.ndarray) and not a.dtype.hasobject


def pack_arrays(arrays: Mapping[tuple[str, str | None], np.ndarray]) -> PackedArrays:
    """The arrays' bytes copied into one buffer (a snapshot: later in-place changes do not show)."""
    layout: list[ArrayEntry] = []
    parts: list[bytes] = []
    offset = 0
    for (name, key), a in arrays.items():
        pad = -offset % _ALIGN
        if pad:
            parts.append(bytes(pad))
            offset += pad
        layout.append((name, key, a.dtype.str, a.shape, offset))
        parts.append(a.tobytes())  # C order, whatever the array's strides
        offset += a.nbytes
    return tuple(layout), b"".join(parts)


def unpack_arrays(layout: tuple[ArrayEntry, ...], blob: bytes) -> dict[tuple[str, str | None], np.ndarray]:
    """Writable arrays over one private copy of ``blob`` (the inverse of ``pack_arrays``)."""
    buf = bytearray(blob)
    return {(name, key): np.ndarray(shape, dtype, buf, offset) for name, key, dtype, shape, offset in layout}


def unpack_weights(packed: PackedArrays) -> dict[str, torch.Tensor]:
    """A state dict packed by the pool (``pack_arrays`` over ``state_to_numpy``) as tensors."""
    return {name: torch.from_numpy(a) for (name, _), a in unpack_arrays(*packed).items()}


def pack_fragment(frag: Fragment) -> PackedFragment | Fragment:
    """Every numeric array field of ``frag`` (and of a dict observation) in one buffer; the other fields as
    they are. A fragment with an object array (text observations) stays a ``Fragment``."""
    arrays: dict[tuple[str, str | None], np.ndarray] = {}
    rest: dict[str, Any] = {}
    for f in dataclasses.fields(frag):
        v = getattr(frag, f.name)
        if isinstance(v, np.ndarray):
            if not _packable(v):
                return frag
            arrays[(f.name, None)] = v
        elif isinstance(v, dict) and v and all(isinstance(k, str) and _packable(x) for k, x in v.items()):
            arrays.update({(f.name, k): x for k, x in v.items()})
        else:
            rest[f.name] = v
    layout, blob = pack_arrays(arrays)
    return layout, blob, rest


def unpack_fragment(packed: PackedFragment | Fragment) -> Fragment:
    """The ``Fragment`` that ``pack_fragment`` packed (writable arrays over one private buffer)."""
    if isinstance(packed, Fragment):
        return packed
    layout, blob, rest = packed
    fields: dict[str, Any] = dict(rest)
    for (name, key), a in unpack_arrays(layout, blob).items():
        if key is None:
            fields[name] = a
        else:
            fields.setdefault(name, {})[key] = a
    return Fragment(**fields)


class RolloutWorker:
    """Builds env copies and a policy from the run config; ``sample`` returns one ``Fragment``."""

    def __init__(self, cfg_data: dict[str, Any], config_dir: str | None, worker_id: int, num_envs: int, seed: int) -> None:
        torch.set_num_threads(1)
        from polar.config import validate
        from polar.config.run import RunConfig
        from polar.harness import make_vector_env
        from polar.models.policy import build_policy
        from polar.rollout.runner import EnvRunner, runner_options

        cfg = validate(RunConfig, cfg_data, source="config (rollout worker)")
        cdir = Path(config_dir) if config_dir else None
        self.worker_id = worker_id
        env = make_vector_env(cfg.harness, num_envs, seed=seed, config_dir=cdir, worker_index=worker_id + 1)
        self.policy = build_policy(cfg, env.single_observation_space, env.single_action_space, cdir)
        self.policy.eval()
        self.runner = EnvRunner(env, self.policy, seed=seed, **runner_options(cfg))
        self.version = -1

    def ready(self) -> dict[str, Any]:
        import ray

        return {"worker_id": self.worker_id, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    def sample(self, num_steps: int, version: int,
               weights: PackedArrays | dict[str, np.ndarray] | None) -> PackedFragment | Fragment:
        """Collect ``num_steps`` steps of every env, first loading ``weights`` (version ``version``) if given;
        the fragment comes back packed (``unpack_fragment``).

        ``weights`` is None when this worker already has ``version`` (the pool sends each version once); packed
        when inline, a dict of (read-only, object-store) arrays when it came as an object-store reference."""
        if weights is not None and version != self.version:
            if isinstance(weights, dict):
                state = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
            else:
                state = unpack_weights(weights)
            self.policy.load_state_dict(state)
            self.version = version
        return pack_fragment(self.runner.collect(num_steps, policy_version=self.version, worker_id=self.worker_id))

    def close(self) -> None:
        self.runner.close()
