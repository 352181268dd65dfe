"""Helpers shared by the provider modules: field checks with messages that name the field."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Iterable
from typing import Any

from polar.gateway.errors import bad

log = logging.getLogger("polar.gateway.providers")

IGNORED_ONCE: set[tuple[str, str]] = set()  # (provider, field) already reported


def note_ignored(provider: str, fields: Iterable[str]) -> None:
    """Fields a harness sends that do not change what the model sees: accepted, reported once each."""
    for field in fields:
        if (provider, field) not in IGNORED_ONCE:
            IGNORED_ONCE.add((provider, field))
            log.info("%s: request field '%s' accepted and ignored (it does not change generation here)", provider, field)


def ignore_unhandled(provider: str, body: dict[str, Any], handled: Iterable[str]) -> None:
    note_ignored(provider, sorted(set(body) - set(handled)))


def require(body: dict[str, Any], key: str, types: type | tuple[type, ...], where: str = "") -> Any:
    if key not in body or body[key] is None:
        raise bad(f"missing required field '{where}{key}'", f"{where}{key}")
    return check_type(body[key], types, f"{where}{key}")


def check_type(value: Any, types: type | tuple[type, ...], name: str) -> Any:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        want = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise bad(f"'{name}' must be {want} (got {type(value).__name__})", name)
    return value


MAX_STOP_SEQUENCES = 32  # stop strings per request (OpenAI allows 4, Gemini 5; docs/gateway.md "Limits")
MAX_STOP_CHARS = 512  # characters per stop string


def stop_list(v: Any, name: str) -> list[str]:
    """The request's stop strings, within the documented caps (a 400 naming the field otherwise)."""
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        raise bad(f"'{name}' must be a string or a list of strings", name)
    if len(v) > MAX_STOP_SEQUENCES:
        raise bad(f"'{name}' has {len(v)} stop sequences; the gateway accepts at most {MAX_STOP_SEQUENCES} "
                  "(docs/gateway.md, Limits)", name)
    for i, s in enumerate(v):
        if len(s) > MAX_STOP_CHARS:
            raise bad(f"'{name}[{i}]' is {len(s)} characters long; a stop sequence may be at most "
                      f"{MAX_STOP_CHARS} characters (docs/gateway.md, Limits)", f"{name}[{i}]")
    return list(v)


_IDS = random.Random()  # seeded from the OS once: response ids need to be unique, not secret
os.register_at_fork(after_in_child=_IDS.seed)  # a forked gateway must not repeat its parent's ids


def new_id(prefix: str) -> str:
    """A response id (``chatcmpl-<24 hex>``): 96 random bits, without a system call per id as uuid4 makes."""
    return f"{prefix}{_IDS.getrandbits(96):024x}"


def now() -> int:
    return int(time.time())


def sse(data: bytes, event: str | None = None) -> bytes:
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"
