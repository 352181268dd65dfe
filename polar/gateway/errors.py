"""Errors the gateway returns to clients. Each provider renders an ``ApiError`` in its own shape.

``kind`` is provider-neutral; the provider modules map it to their error type names and status codes.
"""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal[
    "invalid_request",  # 400: malformed JSON, missing/bad fields, unknown roles or content types
    "context_length",  # 400: prompt longer than the context window (each provider's own message)
    "authentication",  # 401: admin token missing/wrong
    "permission",  # 403: reading another session's records
    "not_found",  # 404: unknown model, unknown session, unknown route
    "method_not_allowed",  # 405: a known path with the wrong HTTP method
    "timeout",  # 408: the request body did not arrive in time
    "too_large",  # 413: body over max_body_bytes
    "rate_limited",  # 429: paused for a weight sync (with Retry-After)
    "server_error",  # 500: the engine failed
    "unavailable",  # 503: the engine/upstream is unreachable or aborted
]

STATUS: dict[str, int] = {
    "invalid_request": 400,
    "context_length": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "timeout": 408,
    "too_large": 413,
    "rate_limited": 429,
    "server_error": 500,
    "unavailable": 503,
}


class ApiError(Exception):
    """A client-visible error: what was wrong, where (``param``), and how to fix it (in ``message``).

    ``code`` names the error more precisely than ``kind`` where a provider's shape has a code field
    (OpenAI's ``error.code``: ``model_not_found``, ``session_not_found``); else the kind's default."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        param: str | None = None,
        retry_after_s: float | None = None,
        prompt_tokens: int | None = None,
        context_length: int | None = None,
        code: str | None = None,
        prompt_tokens_at_least: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        self.prompt_tokens_at_least = prompt_tokens_at_least  # refused before it was fully tokenized
        self.code = code

    @property
    def status(self) -> int:
        return STATUS[self.kind]


def bad(message: str, param: str | None = None) -> ApiError:
    """Shorthand for a 400 naming the offending field."""
    return ApiError("invalid_request", message, param=param)
