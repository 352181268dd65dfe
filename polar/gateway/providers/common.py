"""Helpers shared by the provider modules: field checks with messages that name the field."""

from __future__ import annotations

import logging
import time
import uuid
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


def stop_list(v: Any, name: str) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return list(v)
    raise bad(f"'{name}' must be a string or a list of strings", name)


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def now() -> int:
    return int(time.time())


def sse(data: bytes, event: str | None = None) -> bytes:
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"
