"""KV-cache plumbing for continuous batching: read a transformers cache as per-layer tensors, wrap
tensors back into a cache without copying, and left-pad for merging sequences into one batch."""

from __future__ import annotations

from typing import Any

import torch


def plain_kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Per-layer (keys, values) when every layer is a plain growing KV cache, else None (not mergeable)."""
    from transformers import cache_utils

    layers = getattr(cache, "layers", None)
    if layers is not None:
        if all(type(layer) is cache_utils.DynamicLayer for layer in layers):
            return [(layer.keys, layer.values) for layer in layers]
        return None
    if type(cache) is cache_utils.DynamicCache and hasattr(cache, "key_cache"):  # transformers 4.x
        return list(zip(cache.key_cache, cache.value_cache, strict=True))
    return None


def cache_from_kv(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A DynamicCache holding ``kv`` without copying it (the constructor would concatenate a copy)."""
    from transformers import DynamicCache, cache_utils

    if hasattr(cache_utils, "DynamicLayer"):
        cache = DynamicCache()
        layers = []
        for k, v in kv:
            layer = cache_utils.DynamicLayer()
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
            layers.append(layer)
        cache.layers = layers
        return cache
    return DynamicCache.from_legacy_cache(tuple(kv))  # transformers 4.x


def left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad dim 2 (KV) or dim 1 (mask) with zeros up to ``width``."""
    dim = 2 if t.dim() == 4 else 1
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)
