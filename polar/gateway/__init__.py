"""The model-API gateway: OpenAI Chat/Responses, Anthropic Messages and Gemini in front of one engine,
recording exactly which token ids the policy consumed and sampled, per session.

Start it in-process with :class:`GatewayServer` (or ``polar gateway`` on the command line).
"""

from __future__ import annotations

from typing import Any

__all__ = ["GatewayApp", "GatewayServer", "build_app"]


def __getattr__(name: str) -> Any:  # keep ``import polar.gateway`` light
    if name == "GatewayServer":
        from polar.gateway.server import GatewayServer

        return GatewayServer
    if name == "build_app":
        from polar.gateway.server import build_app

        return build_app
    if name == "GatewayApp":
        from polar.gateway.app import GatewayApp

        return GatewayApp
    raise AttributeError(f"module 'polar.gateway' has no attribute {name!r}")
