"""Gymnasium spaces on the wire, spaces inferred from a first observation, and batch helpers.

A space travels as a plain map so any language can declare one, e.g. ``{"type": "Discrete", "n": 4}``
or ``{"type": "Box", "low": -1.0, "high": 1.0, "shape": [3], "dtype": "float32"}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from polar.errors import EnvContractError

SUPPORTED = "Box, Discrete, MultiDiscrete, MultiBinary, Dict"


def space_to_wire(space: spaces.Space) -> dict[str, Any]:
    if isinstance(space, spaces.Box):
        return {"type": "Box", "low": space.low, "high": space.high, "shape": list(space.shape), "dtype": space.dtype.name}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec, dtype=np.int64)}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": list(np.atleast_1d(space.n))}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_wire(s) for k, s in space.spaces.items()}}
    raise EnvContractError(f"space {space!r} is not supported by connectors; use one of {SUPPORTED}")


def space_from_wire(desc: Any, where: str = "space") -> spaces.Space:
    if not isinstance(desc, dict) or "type" not in desc:
        raise EnvContractError(f"{where}: expected a map with a 'type' key ({SUPPORTED}), got {desc!r}")
    kind = desc["type"]
    try:
        if kind == "Box":
            dtype = np.dtype(desc.get("dtype", "float32"))
            shape = tuple(desc["shape"]) if desc.get("shape") is not None else None
            low, high = _bound(desc.get("low", -np.inf), dtype), _bound(desc.get("high", np.inf), dtype)
            return spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
        if kind == "Discrete":
            return spaces.Discrete(int(desc["n"]), start=int(desc.get("start", 0)))
        if kind == "MultiDiscrete":
            return spaces.MultiDiscrete(np.asarray(desc["nvec"], dtype=np.int64))
        if kind == "MultiBinary":
            n = desc["n"]
            if isinstance(n, int):
                return spaces.MultiBinary(n)
            dims = list(n)
            return spaces.MultiBinary(int(dims[0]) if len(dims) == 1 and isinstance(dims[0], (int, np.integer)) else dims)  # [3]: (3)
        if kind == "Dict":
            return spaces.Dict({k: space_from_wire(v, f"{where}.{k}") for k, v in desc["spaces"].items()})
    except (KeyError, TypeError, ValueError) as e:
        raise EnvContractError(f"{where}: malformed {kind} space {desc!r}: {e}") from None
    raise EnvContractError(f"{where}: unknown space type {kind!r}; use one of {SUPPORTED}")


def _bound(value: Any, dtype: np.dtype) -> Any:
    if isinstance(value, np.ndarray):
        return value.astype(dtype) if dtype.kind == "f" else value
    if value is None:
        return -np.inf
    return value


def infer_space(obs: Any, where: str = "observation") -> spaces.Space:
    """A space that contains ``obs``: Box(-inf, inf) for floats, the dtype's range for ints, Dict for maps."""
    if isinstance(obs, dict):
        if not obs:
            raise EnvContractError(f"{where} is an empty dict; return at least one array")
        return spaces.Dict({str(k): infer_space(v, f"{where}[{k!r}]") for k, v in obs.items()})
    if isinstance(obs, (bool, np.bool_)):
        return spaces.Box(0, 1, shape=(), dtype=np.bool_)
    arr = np.asarray(obs)
    if arr.dtype == np.float64 and not isinstance(obs, np.ndarray):
        arr = arr.astype(np.float32)  # Python floats/lists: float32 is what networks eat
    if arr.dtype.kind == "f":
        return spaces.Box(-np.inf, np.inf, shape=arr.shape, dtype=arr.dtype)
    if arr.dtype.kind in "iu":
        info = np.iinfo(arr.dtype)
        return spaces.Box(info.min, info.max, shape=arr.shape, dtype=arr.dtype)
    if arr.dtype.kind == "b":
        return spaces.Box(0, 1, shape=arr.shape, dtype=np.bool_)
    raise EnvContractError(
        f"{where} has type {type(obs).__name__} (dtype {arr.dtype}); return numpy arrays, numbers or a dict of them"
    )


def space_bytes(space: spaces.Space) -> int:
    """Bytes of one observation of ``space`` as an array (a Dict: the sum of its keys)."""
    if isinstance(space, spaces.Dict):
        return sum(space_bytes(sub) for sub in space.spaces.values())
    shape = space.shape or ()
    dtype = np.dtype(space.dtype) if space.dtype is not None else np.dtype(np.float64)
    return int(np.prod(shape, dtype=object)) * dtype.itemsize


def wire_space_bytes(desc: Any) -> int:
    """Bytes of one value of a space as declared on the wire, from its plain fields only (``shape``, ``dtype``,
    ``n``): no array in it is decoded. 0 where those fields do not say (the caller's base budget covers those)."""
    if not isinstance(desc, dict):
        return 0
    kind = desc.get("type")
    try:
        if kind == "Dict" and isinstance(desc.get("spaces"), dict):
            return sum(wire_space_bytes(sub) for sub in desc["spaces"].values())
        if kind == "Box" and isinstance(desc.get("shape"), list):
            dtype = np.dtype(str(desc.get("dtype", "float32")))
            if dtype.kind not in "biuf":  # a Box of any other dtype is refused when built: it buys no budget
                return 0
            return _count(desc["shape"]) * dtype.itemsize
        if kind == "MultiBinary":
            n = desc.get("n")
            return _count(n if isinstance(n, list) else [n])
    except (TypeError, ValueError):
        return 0
    return 0


def _count(dims: list) -> int:
    """Elements of an array of shape ``dims`` (0 for a negative dimension, which no space accepts)."""
    sizes = [int(d) for d in dims]
    return 0 if any(d < 0 for d in sizes) else int(np.prod(sizes, dtype=object))


def conform(obs: Any, space: spaces.Space) -> Any:
    """Cast a batched or single obs to the space's dtype (no copy when it already matches)."""
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, dict):
            raise EnvContractError(f"observation should be a dict with keys {list(space.spaces)}, got {type(obs).__name__}")
        missing = set(space.spaces) - set(obs)
        if missing:
            raise EnvContractError(f"observation is missing keys {sorted(missing)} of its Dict space")
        return {k: conform(obs[k], s) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Discrete):
        arr = np.asarray(obs)
        return arr.astype(np.int64, copy=False) if arr.ndim else np.int64(arr)
    dtype = getattr(space, "dtype", None)
    arr = np.asarray(obs)
    return arr if dtype is None or arr.dtype == dtype else arr.astype(dtype)


def shape_mismatch(obs: Any, space: spaces.Space, n: int | None = None) -> str | None:
    """Why ``obs`` is not ``n`` observations of ``space`` batched on a leading axis (one when ``n`` is None).

    Shapes and kinds only, no per-element work: this runs on every connector reply, and it is what
    turns a wrong shape into a message naming the shapes instead of a numpy error further down.
    Returns None when the shapes fit; otherwise a phrase like ``has shape (4, 8), expected (4, 5)``.
    """
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, dict):
            return f"is a {type(obs).__name__}, expected a map with keys {sorted(space.spaces)}"
        for key, sub in space.spaces.items():
            if key not in obs:
                return f"lacks the key {key!r} of its Dict space (keys {sorted(space.spaces)})"
            why = shape_mismatch(obs[key], sub, n)
            if why is not None:
                return f"[{key!r}] {why}"
        return None
    return array_mismatch(obs, space.shape if n is None else (n, *space.shape))


def array_mismatch(value: Any, want: tuple[int, ...]) -> str | None:
    """Why ``value`` is not an array of numbers or bools of shape ``want`` (None when it is)."""
    if isinstance(value, np.ndarray):
        arr = value
    elif value is None:
        return f"is nil, expected an ndarray of shape {want}"
    else:  # plain msgpack numbers or lists (a connector may skip the ndarray ext)
        try:
            arr = np.asarray(value)
        except ValueError:  # ragged lists
            return f"is a ragged {type(value).__name__}, expected an ndarray of shape {want}"
    if arr.shape != want:
        return f"has shape {arr.shape}, expected {want}"
    if arr.dtype.kind not in "biuf":
        return f"has dtype {arr.dtype}, expected numbers or bools"
    return None


def stack(items: list[Any]) -> Any:
    """Stack per-env observations into one batched structure (one array per Dict key)."""
    first = items[0]
    if isinstance(first, dict):
        return {k: stack([it[k] for it in items]) for k in first}
    return np.stack([np.asarray(it) for it in items])


def index(batched: Any, i: int) -> Any:
    if isinstance(batched, dict):
        return {k: index(v, i) for k, v in batched.items()}
    return batched[i]


def unbatch_actions(actions: Any, n: int) -> list[Any]:
    """Batched actions -> one action per copy: Python ints for integer vectors, rows otherwise."""
    if isinstance(actions, dict):
        parts = {k: unbatch_actions(v, n) for k, v in actions.items()}
        return [{k: parts[k][i] for k in parts} for i in range(n)]
    arr = np.asarray(actions)
    if arr.ndim == 1 and arr.dtype.kind in "iu":
        return arr.tolist()
    return list(arr)
