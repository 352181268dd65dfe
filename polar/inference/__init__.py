"""Inference engines behind one interface: embedded HF transformers (default), vLLM/SGLang upstreams,
the ``tiny`` preset, and a ``ScriptedEngine`` for tests and docs. See :mod:`polar.inference.base`.

Heavy modules (torch/transformers) load lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

from polar.inference.base import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    TokenEvent,
    UpstreamUnavailable,
    collect,
)
from polar.inference.loading import load_engine

_LAZY = {
    "EmbeddedEngine": "polar.inference.embedded",
    "ScriptedEngine": "polar.inference.scripted",
    "UpstreamEngine": "polar.inference.upstream",
    "UpstreamConfig": "polar.inference.upstream",
    "build_tiny": "polar.inference.tiny",
    "build_tiny_tokenizer": "polar.inference.tiny",
}

__all__ = [
    "ContextLengthExceeded",
    "Engine",
    "EngineError",
    "GenerationRequest",
    "GenerationResult",
    "TokenEvent",
    "UpstreamUnavailable",
    "collect",
    "load_engine",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'polar.inference' has no attribute {name!r}")
