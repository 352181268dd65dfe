"""The rollout worker as a Ray actor: ``envs_per_worker`` env copies stepped by one ``EnvRunner``.

It is the same ``EnvRunner`` the local backend runs in its worker processes; only the transport
differs. Weights ride with a ``sample`` call only when the worker does not have that version yet:
inline in the call when small (a put into the object store costs more than the bytes), else as one
object-store reference shared by every worker, which Ray resolves to zero-copy numpy arrays before
the call runs (``polar.rollout.backends.ray_pool``).

Inline weights and every fragment travel packed: the arrays' bytes in one ``bytes`` object plus their
layout as JSON ``bytes`` (``pack_arrays``, ``LayoutCodec``). Ray serializes a dict of numpy arrays array
by array, each with its own pickle-5 buffer and header, and pickles any tuple it is given; ``bytes``
cost it nearly nothing. With a CartPole policy's 12 tensors inline in a call and a fragment's 10 arrays
in its reply the dicts cost the driver and the actor ~0.35 ms of CPU each per call on the 2-core box,
about as much as the rest of the call, and the layouts as Python tuples another ~0.1-0.2 ms
(docs/benchmarks.md, "Ray's tax on one machine"). A layout is encoded once and decoded once per run
(it only changes if the arrays' shapes do).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polar.types import Fragment

#: One packed array: (name, sub-key or None, numpy dtype string, shape, byte offset in the buffer).
ArrayEntry = tuple[str, str | None, str, tuple[int, ...], int]
Layout = tuple[ArrayEntry, ...]
#: Arrays packed into one buffer: their layout and their bytes (``pack_arrays``).
PackedArrays = tuple[Layout, bytes]
#: A fragment on the wire: its layout (``LayoutCodec.encode``), its arrays' bytes, its other fields as they are.
PackedFragment = tuple[bytes, bytes, dict[str, Any]]

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


def unpack_arrays(layout: Layout, blob: bytes) -> dict[tuple[str, str | None], np.ndarray]:
    """Writable arrays over one private copy of ``blob`` (the inverse of ``pack_arrays``)."""
    buf = bytearray(blob)
    return {(name, key): np.ndarray(shape, dtype, buf, offset) for name, key, dtype, shape, offset in layout}


class LayoutCodec:
    """Layouts on the wire as JSON ``bytes``: the last one encoded is reused while it is unchanged, and each
    distinct one is parsed once (a run has one per direction)."""

    _MAX_DECODED = 64

    def __init__(self) -> None:
        self._last: tuple[Layout, bytes] | None = None
        self._decoded: dict[bytes, Layout] = {}

    def encode(self, layout: Layout) -> bytes:
        if self._last is None or self._last[0] != layout:
            self._last = (layout, json.dumps(layout).encode())
        return self._last[1]

    def decode(self, raw: bytes) -> Layout:
        layout = self._decoded.get(raw)
        if layout is None:
            if len(self._decoded) >= self._MAX_DECODED:
                self._decoded.clear()
            layout = tuple((name, key, dtype, tuple(shape), offset) for name, key, dtype, shape, offset in json.loads(raw))
            self._decoded[raw] = layout
        return layout


def unpack_weights(layout: Layout, blob: bytes) -> dict[str, torch.Tensor]:
    """A state dict packed by the pool (``pack_arrays`` over ``state_to_numpy``) as tensors."""
    return {name: torch.from_numpy(a) for (name, _), a in unpack_arrays(layout, blob).items()}


def pack_fragment(frag: Fragment, codec: LayoutCodec) -> PackedFragment | Fragment:
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
    return codec.encode(layout), blob, rest


def unpack_fragment(packed: PackedFragment | Fragment, codec: LayoutCodec) -> Fragment:
    """The ``Fragment`` that ``pack_fragment`` packed (writable arrays over one private buffer)."""
    if isinstance(packed, Fragment):
        return packed
    raw_layout, blob, rest = packed
    fields: dict[str, Any] = dict(rest)
    for (name, key), a in unpack_arrays(codec.decode(raw_layout), blob).items():
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
        self.codec = LayoutCodec()  # the weights' layouts in, the fragments' out

    def ready(self) -> dict[str, Any]:
        import ray

        return {"worker_id": self.worker_id, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    def sample(self, num_steps: int, version: int, weights: bytes | dict[str, np.ndarray] | None,
               weights_layout: bytes | None = None) -> PackedFragment | Fragment:
        """Collect ``num_steps`` steps of every env, first loading ``weights`` (version ``version``) if given;
        the fragment comes back packed (``unpack_fragment``).

        ``weights`` is None when this worker already has ``version`` (the pool sends each version once); packed
        (``pack_arrays``, with its encoded ``weights_layout``) when inline, a dict of (read-only,
        object-store) arrays when it came as an object-store reference."""
        if weights is not None and version != self.version:
            if isinstance(weights, dict):
                state = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
            else:
                if weights_layout is None:
                    raise ValueError("packed weights need their weights_layout")
                state = unpack_weights(self.codec.decode(weights_layout), weights)
            self.policy.load_state_dict(state)
            self.version = version
        frag = self.runner.collect(num_steps, policy_version=self.version, worker_id=self.worker_id)
        return pack_fragment(frag, self.codec)

    def close(self) -> None:
        self.runner.close()
