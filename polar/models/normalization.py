"""Running mean/std normalizers for observations and rewards; their buffers travel with the weights
(workers normalize with the learner's statistics) and are saved in checkpoints."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.models.encoders import is_image_space, module_key


class RunningNorm(nn.Module):
    """Chan et al. parallel mean/variance; forward normalizes and clips."""

    def __init__(self, shape: tuple[int, ...], clip: float) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def update(self, batch_mean, batch_var, batch_count: float) -> None:
        if batch_count <= 0:
            return
        bm = torch.as_tensor(batch_mean, dtype=torch.float64)
        bv = torch.as_tensor(batch_var, dtype=torch.float64)
        delta = bm - self.mean
        tot = self.count + batch_count
        new_mean = self.mean + delta * batch_count / tot
        m2 = self.var * self.count + bv * batch_count + delta.pow(2) * self.count * batch_count / tot
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / tot)
        self.count.fill_(float(tot))

    def set(self, mean, var, count: float) -> None:
        """Replace the statistics (offline runs: the dataset's, frozen from then on)."""
        self.mean.copy_(torch.as_tensor(mean, dtype=torch.float64))
        self.var.copy_(torch.as_tensor(var, dtype=torch.float64))
        self.count.fill_(float(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean.float()
        std = (self.var.float() + 1e-8).sqrt()
        return ((x.float() - mean) / std).clamp(-self.clip, self.clip)


def moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(mean, var, count) over all leading dims of a batch [..., *shape]."""
    return x.mean(axis=0), x.var(axis=0), x.shape[0]


class ObsNormalizer(nn.Module):
    """Normalizes float Box observations (or the float Box keys of a Dict); images and ints pass through."""

    def __init__(self, space: gym.Space, clip: float) -> None:
        super().__init__()
        self.is_dict = isinstance(space, gym.spaces.Dict)
        if self.is_dict:
            self.norms = nn.ModuleDict({module_key(k): RunningNorm(s.shape, clip) for k, s in space.spaces.items()
                                        if self._eligible(s)})
        else:
            self.norm = RunningNorm(space.shape, clip) if self._eligible(space) else None

    @staticmethod
    def _eligible(space: gym.Space) -> bool:
        return isinstance(space, gym.spaces.Box) and not is_image_space(space) and np.issubdtype(space.dtype, np.floating)

    def forward(self, obs):
        if self.is_dict:
            return {k: (self.norms[module_key(k)](v) if module_key(k) in self.norms else v) for k, v in obs.items()}
        return self.norm(obs) if self.norm is not None else obs

    def update_from_moments(self, m) -> None:
        """Merge raw-obs (mean, var, count) from a fragment (a dict of them for Dict spaces)."""
        if self.is_dict:
            for k, moments_k in m.items():
                if module_key(k) in self.norms:
                    self.norms[module_key(k)].update(*moments_k)
        elif self.norm is not None and m is not None:
            self.norm.update(*m)

    def set_from_data(self, obs: np.ndarray) -> None:
        """Set the statistics to a whole dataset's (mean, var, count), computed in float64 (offline runs)."""
        if self.is_dict or self.norm is None:
            raise ValueError("set_from_data takes the observations of a float Box space")
        x = np.asarray(obs, dtype=np.float64)
        self.norm.set(*moments(x))
