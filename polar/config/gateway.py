"""``gateway:`` section (also read by ``polar gateway --config``)."""

from __future__ import annotations

from polar.config.base import StrictModel


class GatewayConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = 0
    model: str = "tiny"
