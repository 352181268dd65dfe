"""Observation encoders: MLP for vectors, a small or the Nature CNN for uint8 images, one encoder per Dict key."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.errors import ConfigError

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def is_image_space(space: gym.Space) -> bool:
    """uint8 HxWxC boxes are images (channels last, as Gymnasium renders them)."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def flat_dim(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.asarray(space.nvec).sum())
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
        return int(np.prod(space.shape))
    raise TypeError(f"unsupported observation space {space}")


def mlp(in_dim: int, hidden_sizes: list[int], activation: str) -> tuple[nn.Module, int]:
    layers: list[nn.Module] = []
    for h in hidden_sizes:
        layers += [nn.Linear(in_dim, h), ACTIVATIONS[activation]()]
        in_dim = h
    return nn.Sequential(*layers), in_dim


class Flatten(nn.Module):
    """Flatten (and one-hot discrete) observations to float vectors."""

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        self.space = space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self.multi = [int(n) for n in np.asarray(space.nvec).reshape(-1)] if isinstance(space, gym.spaces.MultiDiscrete) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return nn.functional.one_hot(x.long().reshape(-1), self.space.n).float()
        if self.multi is not None:
            x = x.long().reshape(x.shape[0], -1)
            return torch.cat([nn.functional.one_hot(x[:, i], n).float() for i, n in enumerate(self.multi)], -1)
        return x.reshape(x.shape[0], -1).float()


class CNNEncoder(nn.Module):
    """Conv stack for uint8 HxWxC images, scaled to [0, 1]; output flattened."""

    def __init__(self, space: gym.spaces.Box, channels: list[int], activation: str) -> None:
        super().__init__()
        h, w, c = space.shape
        layers: list[nn.Module] = []
        in_c = c
        for out_c in channels:
            stride = 2 if min(h, w) >= 16 else 1
            layers += [nn.Conv2d(in_c, out_c, 3, stride=stride, padding=1), ACTIVATIONS["relu"]()]
            in_c = out_c
        layers.append(nn.Flatten())
        self.net = nn.Sequential(*layers)
        with torch.no_grad():
            self.out_dim = int(self.net(torch.zeros(1, c, h, w)).shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.permute(0, 3, 1, 2).float() / 255.0)


class NatureCNN(nn.Module):
    """Mnih et al. 2015's conv stack (32 8x8/4, 64 4x4/2, 64 3x3/1) for uint8 HxWxC frame stacks, scaled to [0, 1].

    With ``hidden_sizes: [512]`` the head after it is the paper's 512-unit layer (SB3's NatureCNN)."""

    def __init__(self, space: gym.spaces.Box) -> None:
        super().__init__()
        h, w, c = space.shape
        if min(h, w) < 36:
            raise ConfigError(f"agent.cnn_arch: nature needs images of at least 36x36 (got {h}x{w}); use small")
        self.net = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            self.out_dim = int(self.net(torch.zeros(1, c, h, w)).shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.permute(0, 3, 1, 2).float() / 255.0)


def module_key(key: str) -> str:
    """A Dict observation key as a ``ModuleDict`` key. Most keys are kept as they are (checkpoints keep their
    parameter names); one torch cannot hold, such as ``keys`` (a ``ModuleDict`` method) or one with a dot, is
    spelled ``obs_<hex of its UTF-8>``."""
    if key and "." not in key and not hasattr(nn.ModuleDict, key) and not key.startswith("obs_"):
        return key
    return "obs_" + key.encode().hex()


class DictEncoder(nn.Module):
    """One encoder per key (sorted), outputs concatenated."""

    def __init__(self, encoders: dict[str, nn.Module], out_dims: dict[str, int]) -> None:
        super().__init__()
        self.keys = sorted(encoders)
        self.encoders = nn.ModuleDict({module_key(k): m for k, m in encoders.items()})
        self.out_dim = sum(out_dims.values())

    def forward(self, obs: dict) -> torch.Tensor:
        return torch.cat([self.encoders[module_key(k)](obs[k]) for k in self.keys], -1)


def build_encoder(space: gym.Space, hidden_sizes: list[int], activation: str, cnn_channels: list[int],
                  cnn_arch: str = "small") -> tuple[nn.Module, int]:
    """An encoder for ``space`` and its output width (``cnn_arch``: small or nature, for image spaces)."""
    if isinstance(space, gym.spaces.Dict):
        encs, dims = {}, {}
        for key, sub in space.spaces.items():
            encs[key], dims[key] = build_encoder(sub, hidden_sizes, activation, cnn_channels, cnn_arch)
        enc = DictEncoder(encs, dims)
        return enc, enc.out_dim
    if is_image_space(space):
        cnn: CNNEncoder | NatureCNN = (
            NatureCNN(space) if cnn_arch == "nature" else CNNEncoder(space, cnn_channels, activation)
        )
        head, out = mlp(cnn.out_dim, hidden_sizes[-1:], "relu")
        return nn.Sequential(cnn, head), out
    body, out = mlp(flat_dim(space), hidden_sizes, activation)
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1 and space.dtype == np.float32:
        return body, out  # no flatten/cast on the hot path for float32 vectors (float64 ones, MuJoCo's, are cast)
    return nn.Sequential(Flatten(space), body), out
