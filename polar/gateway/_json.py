"""Fast JSON for the hot path: orjson when installed, the stdlib otherwise (same results)."""

from __future__ import annotations

from typing import Any

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    def loads(data: bytes | str) -> Any:
        return orjson.loads(data)

    def canonical(obj: Any) -> bytes:
        """Key-sorted compact bytes, for hashing and equality of normalized messages."""
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)

    def dumps_record(record: Any) -> bytes:
        """A dataclass record (orjson serializes dataclasses natively, without ``asdict``'s deep copies)."""
        return orjson.dumps(record)

    JSONDecodeError: type[Exception] = orjson.JSONDecodeError

except ImportError:  # pragma: no cover - exercised only without orjson
    import json

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    def loads(data: bytes | str) -> Any:
        return json.loads(data)

    def canonical(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()

    def dumps_record(record: Any) -> bytes:
        from dataclasses import asdict

        return dumps(asdict(record))

    JSONDecodeError = json.JSONDecodeError
