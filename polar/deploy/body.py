"""Request bodies of ``polar serve``: JSON in, with tensors as numpy arrays, parsed where it cannot stall the
server.

JSON parsing and list-to-array conversion are CPU work that holds Python's GIL: a 16 MiB body parsed on a
thread of the server's process still stops its event loop for the whole parse (longer, with the threads
handing the GIL back and forth). Bodies above ``INLINE_BYTES`` are therefore parsed in a worker process
(``BodyParser``), which hands back the body with its tensor lists already numpy arrays; small ones are parsed
in place, where a thread hop would cost more than the parse. This module imports only the standard library
and numpy, so the worker starts fast.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

INLINE_BYTES = 256 * 1024  # bodies up to this size are parsed in the server's process


class BodyError(Exception):
    """A body that is not acceptable JSON: answered 400 with the message."""


def _no_constants(name: str) -> Any:
    raise BodyError(f"the request body holds {name}, which is not JSON; send finite numbers")


def _as_array(data: Any) -> Any:
    """``data`` as a numpy array when it is a non-empty, regular, numeric nested list; else unchanged (the
    request's checks then say what is wrong with it)."""
    if not isinstance(data, list) or not data:
        return data
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        return data
    return arr if arr.dtype.kind in "biuf" else data


def parse_json(raw: bytes, arrays: bool) -> Any:
    """The body as Python objects; NaN/Infinity and nesting past the parser's limit raise ``BodyError``. With
    ``arrays``, the tensor lists (``inputs[*].data``, ``observation``/``observations``) become numpy arrays."""
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise BodyError("the request body nests too deeply to parse; send tensors flat (with their shape)") from None
    except ValueError as e:  # BodyError from _no_constants is not a ValueError: it passes through
        raise BodyError(f"the request body is not valid JSON: {e}") from None
    if arrays and isinstance(body, dict):
        inputs = body.get("inputs")
        if isinstance(inputs, list):
            for inp in inputs:
                if isinstance(inp, dict) and "data" in inp:
                    inp["data"] = _as_array(inp["data"])
        for key in ("observation", "observations"):
            if key in body:
                body[key] = _as_array(body[key])
    return body


def _parse_in_worker(raw: bytes) -> tuple[bool, Any]:
    """(True, body) or (False, message): nothing but plain data crosses back from the worker."""
    try:
        return True, parse_json(raw, arrays=True)
    except BodyError as e:
        return False, str(e)
    except RecursionError:
        return False, "the request body nests too deeply to parse; send tensors flat (with their shape)"


class BodyParser:
    """Parses request bodies: small ones here, large ones in a pool of worker processes started on first use."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    async def parse(self, raw: bytes) -> Any:
        if len(raw) <= INLINE_BYTES:
            return parse_json(raw, arrays=False)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        ok, out = await asyncio.wrap_future(self._pool.submit(_parse_in_worker, raw))
        if not ok:
            raise BodyError(out)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
