"""``agent:`` section: a built-in network or a user's own ``AgentBase`` class."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from polar.config.base import StrictModel


class BuiltinAgentConfig(StrictModel):
    """A built-in actor-critic: one encoder per observation key (MLP, or CNN for uint8 HxWxC images),
    optionally an LSTM core, and a head matched to the action space (Discrete, MultiDiscrete, Box)."""

    type: Literal["mlp", "cnn", "lstm"] = "mlp"
    hidden_sizes: list[int] = Field(default_factory=lambda: [64, 64])
    activation: Literal["tanh", "relu"] = "tanh"
    share_encoder: bool = Field(False, description="one trunk for actor and critic (default: separate, as in SB3)")
    lstm_hidden_size: int = Field(64, ge=1)
    cnn_channels: list[int] = Field(default_factory=lambda: [16, 32])
    cnn_arch: Literal["small", "nature"] = Field(
        "small", description="small: 3x3 convs of cnn_channels; nature: Mnih et al. 2015's 8x8/4x4/3x3 (Atari)"
    )
    log_std_init: float = 0.0
    ortho_init: bool = True


class CustomAgentConfig(StrictModel):
    type: Literal["custom"] = "custom"
    module: str
    class_name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)

