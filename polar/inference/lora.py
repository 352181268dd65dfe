"""LoRA adapters as a weight-sync payload: a LoRA run sends the adapters only (a few MB), not merged weights.

A :class:`LoraAdapter` is the peft adapter's tensors (peft's own names, as ``adapter_model.safetensors``
holds them) and its ``adapter_config.json``. It is a ``dict`` of tensors, so it travels every path a state
dict travels (the gateway, the session service, Ray); an engine that serves adapters
(:mod:`polar.inference.upstream.sync`, vLLM's ``/v1/load_lora_adapter``) recognizes it by its type.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


class LoraAdapter(dict[str, torch.Tensor]):
    """The adapter tensors (peft names, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``)
    and ``config``: peft's adapter config as JSON (``r``, ``lora_alpha``, ``target_modules``, ...)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> None:
        super().__init__(tensors)
        self.config: dict[str, Any] = _jsonable(dict(config))

    @property
    def rank(self) -> int:
        return int(self.config.get("r", 8))

    @property
    def scaling(self) -> float:
        """peft's ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``)."""
        alpha = float(self.config.get("lora_alpha", self.rank))
        return alpha / math.sqrt(self.rank) if self.config.get("use_rslora") else alpha / self.rank

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.values())

    def deltas(self) -> dict[str, torch.Tensor]:
        """``scaling * B @ A`` per adapted weight, named as the base model's state dict names that weight."""
        out: dict[str, torch.Tensor] = {}
        for name, a in self.items():
            if ".lora_A." not in name:
                continue
            b = self.get(name.replace(".lora_A.", ".lora_B."))
            if b is None:
                raise ValueError(f"LoRA adapter tensor {name} has no lora_B partner")
            base = name.replace(".lora_A.weight", ".weight").replace(".lora_A.default.weight", ".weight")
            base = base.removeprefix("base_model.model.")
            out[base] = self.scaling * (b.float() @ a.float())
        return out

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (Ray, multiprocessing) with its config
        return (LoraAdapter, (dict(self), self.config))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)  # enums (peft's task_type) and the like


def write_adapter_folder(adapter: LoraAdapter, root: Path, version: int, dtype: str = "float32") -> Path:
    """``root/lora-v<version>/`` with ``adapter_model.safetensors`` and ``adapter_config.json``, written
    whole before it is visible (a temporary name, then a rename)."""
    from safetensors.torch import save_file

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"lora-v{version:06d}"
    tmp = root / f".lora-v{version:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    tensors = {k: v.detach().to("cpu", torch_dtype).contiguous() for k, v in adapter.items()}
    save_file(tensors, str(tmp / ADAPTER_WEIGHTS))
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter.config, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def prune_adapter_folders(root: Path, keep: set[Path]) -> None:
    """Remove every ``lora-v*`` folder under ``root`` but ``keep``."""
    for folder in root.glob("lora-v*"):
        if folder not in keep:
            shutil.rmtree(folder, ignore_errors=True)


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "LoraAdapter", "prune_adapter_folders", "write_adapter_folder"]
