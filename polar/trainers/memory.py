"""How much memory an agent run needs, estimated before it starts, and a warning when this machine has less.

The estimate is the sum of what the run keeps (fp32 weights on CPU):

- the engine's copy of the model (embedded: fp32; each launched vLLM replica: its dtype plus its KV cache);
- the learner's copy, and for a full fine-tune its gradients and AdamW's two moments (16 bytes a parameter);
  with LoRA the adapters' share of that (the base weights are frozen);
- a full fine-tune's KL reference (``kl_coef > 0``): one more fp32 copy (LoRA switches its adapters off);
- one micro-batch's activations: ``micro_batch_size`` sequences of ``ASSUMED_SEQUENCE_TOKENS`` tokens, each
  token holding the logits' three vocabulary-wide rows (logits, log-softmax, gradient) and the layers'
  saved activations (``ACTIVATION_FLOATS_PER_LAYER`` x hidden per layer; a quarter of that with gradient
  checkpointing);
- the process itself (Python, torch, tokenizer, gateway): ``BASE_BYTES``.

Calibrated on two measurements: docs/benchmarks.md, "GRPO step memory" (SmolLM2-135M, LoRA r=16, a step of
micro-batches of 4 x 256 tokens: 4.4 GB above the loaded model, about 4 MB a token), and the whole
``examples/agentic/real_model_grpo.yaml`` run (LoRA, micro-batches of 8 short sessions) at about 6.7 GB: this
estimate gives 5.9 GiB (6.4 GB) there. It is an estimate to warn on, not a bound: longer sequences need more
(``micro_batch_size`` and ``gradient_checkpointing`` are the levers).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from polar.config.run import AgentRunConfig, RunConfig

log = logging.getLogger(__name__)

GIB = 1024**3
BASE_BYTES = int(1.0 * GIB)
ASSUMED_SEQUENCE_TOKENS = 128  # a short agent session's sequence (the sums agent's)
ACTIVATION_FLOATS_PER_LAYER = 50
LORA_TRAINABLE_SHARE = 0.04  # r=16 on every linear projection of SmolLM2-135M: 4.9M of 139M
# presets whose folder may not be converted yet: (parameters, hidden size, layers, vocabulary)
PRESET_SHAPES = {"smollm2-135m": (134_515_008, 576, 30, 49_152), "tiny": (190_000, 64, 2, 512)}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass
class ModelShape:
    params: int
    hidden: int
    layers: int
    vocab: int


@dataclass
class MemoryEstimate:
    """Bytes, by part; ``total`` is what the run is expected to peak at."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        return ", ".join(f"{k} {v / GIB:.1f}" for k, v in self.parts.items() if v >= 0.05 * GIB)


def model_shape(spec: str) -> ModelShape | None:
    """Parameters and sizes of a preset or a local HF folder (from ``config.json`` and the safetensors' sizes,
    without reading weights); None when they cannot be known before the model loads (a server URL)."""
    if spec in PRESET_SHAPES:
        return ModelShape(*PRESET_SHAPES[spec])
    folder = Path(spec).expanduser()
    config_file = folder / "config.json"
    if not config_file.is_file():
        return None
    try:
        cfg = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return None
    width = _DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"), 4)
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    if not weights:
        return None
    return ModelShape(weights // width, int(cfg.get("hidden_size", 0)), int(cfg.get("num_hidden_layers", 0)),
                      int(cfg.get("vocab_size", 0)))


def estimate_agent_run(cfg: AgentRunConfig, shape: ModelShape) -> MemoryEstimate:
    """The memory ``cfg`` (an agent run) needs with a model of ``shape``."""
    kw = cfg.policy.kwargs
    n = shape.params
    fp32 = 4 * n
    parts: dict[str, int] = {"process": BASE_BYTES}
    launched = cfg.model if cfg.model is not None else cfg.gateway
    if getattr(launched, "engine", "embedded") == "vllm":
        ek = dict(getattr(launched, "engine_kwargs", {}) or {})
        width = _DTYPE_BYTES.get(str(ek.get("dtype", "float32")), 4)
        parts["vllm replicas"] = int(launched.replicas) * (width * n + int(ek.get("kv_cache_space_gib", 1)) * GIB
                                                           + BASE_BYTES)
    else:
        parts["engine"] = fp32
    lora = getattr(kw, "lora", None)
    trainable = int(n * LORA_TRAINABLE_SHARE) if lora is not None else n
    parts["learner"] = fp32 + 12 * trainable  # weights + gradients + AdamW's two moments of what trains
    if lora is None and float(getattr(kw, "kl_coef", 0.0)) > 0:
        parts["KL reference"] = fp32
    micro = int(getattr(kw, "micro_batch_size", getattr(kw, "batch_size", 8)))
    per_layer = ACTIVATION_FLOATS_PER_LAYER // (4 if getattr(kw, "gradient_checkpointing", False) else 1)
    per_token = 4 * (3 * shape.vocab + per_layer * shape.hidden * shape.layers)
    parts["activations"] = micro * ASSUMED_SEQUENCE_TOKENS * per_token
    return MemoryEstimate(parts)


def available_bytes() -> int | None:
    """Memory this process may still use: MemAvailable, or a cgroup limit below it (containers)."""
    import psutil

    avail = int(psutil.virtual_memory().available)
    for limit_file in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            raw = limit_file.read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            avail = min(avail, int(raw))
    return avail


def memory_warning(cfg: RunConfig, available: int | None = None) -> str | None:
    """The warning for a run that will not fit (None when it fits, or when its size cannot be known)."""
    if not isinstance(cfg, AgentRunConfig):
        return None
    spec = cfg.model.name_or_path if cfg.model is not None else cfg.gateway.model
    shape = model_shape(str(spec))
    if shape is None:
        return None
    est = estimate_agent_run(cfg, shape)
    available = available_bytes() if available is None else available
    if available is None or est.total <= available:
        log.info("memory: this run needs about %.1f GiB (%s), %.1f GiB available", est.total / GIB, est.describe(),
                 (available or 0) / GIB)
        return None
    micro = int(getattr(cfg.policy.kwargs, "micro_batch_size", 8))
    levers = [f"policy.kwargs.micro_batch_size (now {micro})"]
    if not getattr(cfg.policy.kwargs, "gradient_checkpointing", False):
        levers.append("policy.kwargs.gradient_checkpointing: true")
    from polar.config.grpo import GRPOKwargs

    if getattr(cfg.policy.kwargs, "lora", None) is None and isinstance(cfg.policy.kwargs, GRPOKwargs):
        levers.append("policy.kwargs.lora: {} (no gradients or optimizer state for the base weights)")
    return (f"this run needs about {est.total / GIB:.1f} GiB ({est.describe()} GiB) and this machine has "
            f"{available / GIB:.1f} GiB available: it may be killed for memory. What lowers it: "
            + "; ".join(levers))
