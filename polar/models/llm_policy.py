"""The trainable side of an LLM policy: an HF causal LM (optionally with LoRA), batched per-token
logprobs over trajectory samples, demonstrations → token ids + loss masks, and weight export for sync."""

from __future__ import annotations

import copy
import logging
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from polar.errors import ConfigError
from polar.types import TrajectorySample

log = logging.getLogger(__name__)


@dataclass
class TokenBatch:
    token_ids: torch.Tensor  # [B, T] right-padded
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T]
    old_logprobs: torch.Tensor  # [B, T]

    def to(self, device: torch.device) -> TokenBatch:
        """The same batch on ``device`` (a no-op on the device it is already on)."""
        return TokenBatch(*(getattr(self, f.name).to(device) for f in fields(self)))


def collate(samples: list[TrajectorySample], pad_id: int) -> TokenBatch:
    width = max(len(s.token_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.float32)
    old = torch.zeros((len(samples), width), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.token_ids)
        ids[i, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        att[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
    mask[:, 0] = 0.0  # the first token has no context to be predicted from
    return TokenBatch(ids, att, mask, old)


class LLMPolicy:
    """Wraps the model being trained. ``lora`` (a ``LoraConfig`` section) trains adapters only.

    The weights (and so the optimizer state) are fp32 on ``device`` (see
    :func:`polar.trainers.device.learner_device`); every batch is moved there. ``autocast="bf16"`` runs
    the forward passes under ``torch.autocast(bfloat16)``; ``gradient_checkpointing`` recomputes each
    layer's activations in the backward pass instead of keeping them (HF ``gradient_checkpointing_enable``).
    """

    def __init__(self, model: Any, tokenizer: Any, lora: Any = None, *, device: torch.device | str = "cpu",
                 autocast: str = "off", gradient_checkpointing: bool = False) -> None:
        self.tokenizer = tokenizer
        self.lora = lora
        self.device = torch.device(device)
        self.autocast = autocast
        model = model.float().to(self.device).train()
        if gradient_checkpointing:
            # non-reentrant: works when the inputs need no grad (LoRA, frozen embeddings)
            opts = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name for it
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=opts)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=opts)
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            targets = lora.target_modules or _default_targets(model)
            with warnings.catch_warnings():  # peft reads transformers 5's deprecated name: not the user's to fix
                warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                        category=FutureWarning)
                model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                         target_modules=targets, bias="none"))
        self.model = model
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # set by from_engine when the engine takes LoRA adapters (vLLM --enable-lora): syncs send only them
        self.sync_adapters = False

    @classmethod
    def from_engine(cls, engine: Any, lora: Any = None, **options: Any) -> LLMPolicy:
        """A trainable copy of the embedded engine's model (the engine keeps serving its own copy; see
        docs/inference.md, "Learner and engine weights"), or for an upstream engine (launched vLLM, a
        vLLM/SGLang URL whose tokenizer is a local folder) the served folder loaded in fp32. ``options``: ``device``, ``autocast``,
        ``gradient_checkpointing`` as in the constructor."""
        model = getattr(engine, "model", None)
        if model is not None:
            return cls(copy.deepcopy(model), engine.tokenizer, lora, **options)
        folder = getattr(engine, "model_folder", None)  # an upstream engine (vLLM, SGLang) over a local folder
        if folder is None or not (Path(folder) / "config.json").is_file():
            raise ConfigError(
                f"engine {type(engine).__name__} has no local model to train; GRPO/SFT need the embedded engine "
                "(model: tiny or a local HF folder), a launched vLLM (model: {engine: vllm}), or an upstream whose "
                "tokenizer is the served model's folder"
            )
        from transformers import AutoModelForCausalLM

        log.info("learner: %s loaded in fp32 from the served model's folder %s", type(engine).__name__, folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
        policy = cls(model, engine.tokenizer, lora, **options)
        prepare = getattr(engine, "prepare_lora_sync", None)  # an upstream vLLM: adapters only, checked now
        if lora is not None and prepare is not None:
            policy.sync_adapters = bool(prepare(lora.r))
        return policy

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def collate(self, samples: list[TrajectorySample]) -> TokenBatch:
        """``samples`` padded into one batch on this policy's device (the learners in ``polar.algorithms``
        batch through the policy, so they need not import this module)."""
        return collate(samples, self.pad_id).to(self.device)

    def logits(self, batch: TokenBatch, model: Any = None) -> torch.Tensor:
        """fp32 logits of ``model`` (default: the trained one) over ``batch``, which must be on ``self.device``."""
        model = self.model if model is None else model
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast == "bf16"):
            out = model(input_ids=batch.token_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        return out.float()

    def logits_and_hidden(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 logits and the last layer's hidden states ``[B, T, H]`` (after the final norm: what the LM
        head reads) of the trained model over ``batch``, from one forward pass (the value head reads them)."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast == "bf16"):
            out = self.model(input_ids=batch.token_ids, attention_mask=batch.attention_mask, use_cache=False,
                             output_hidden_states=True)
        return out.logits.float(), out.hidden_states[-1].float()

    def token_logprobs(self, batch: TokenBatch, model: Any = None) -> torch.Tensor:
        """``[B, T]`` log-probs of ``batch.token_ids`` under ``model`` (default: the trained one) at the trained
        positions (``loss_mask == 1``; 0 elsewhere, where no loss reads them). The LM head runs only at the
        positions that predict a trained token (HF ``logits_to_keep`` as a boolean mask): a turn samples a
        few of its hundreds of tokens, and the ``[B, T, vocab]`` logits and their log-softmax were most of
        the learner's memory and a fifth of its compute. A model whose forward cannot keep a mask falls back
        to full logits, with the same result."""
        model = self.model if model is None else model
        trained = batch.loss_mask[:, 1:] > 0
        if _keeps_logit_mask(model):
            keep = torch.nn.functional.pad(trained, (0, 1))  # position t-1 predicts token t
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast == "bf16"):
                kept = model(input_ids=batch.token_ids, attention_mask=batch.attention_mask, use_cache=False,
                             logits_to_keep=keep).logits
            if kept.dim() == 2 and kept.shape[0] == int(trained.sum()):
                rows, cols = trained.nonzero(as_tuple=True)
                picked = torch.log_softmax(kept.float(), dim=-1).gather(
                    -1, batch.token_ids[rows, cols + 1].unsqueeze(-1)).squeeze(-1)
                out = torch.zeros(batch.token_ids.shape, dtype=picked.dtype, device=picked.device)
                return out.index_put((rows, cols + 1), picked)
            _NO_LOGIT_MASK.add(type(_base_model(model)))
        logp = torch.log_softmax(self.logits(batch, model)[:, :-1], dim=-1)
        picked = logp.gather(-1, batch.token_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return torch.nn.functional.pad(picked * trained, (1, 0))

    def logit_positions(self, samples: list[TrajectorySample]) -> int:
        """How many positions ``token_logprobs`` runs the LM head at for one batch of ``samples``."""
        if _keeps_logit_mask(self.model):
            return sum(sum(1 for m in s.loss_mask[1:] if m) for s in samples)
        return len(samples) * max(len(s.token_ids) for s in samples)

    def base_token_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """``token_logprobs`` of the model as it was before training, without grad: with LoRA the same base
        weights with the adapters switched off (no second copy of the model is ever made)."""
        if self.lora is None:
            raise ValueError("base_token_logprobs needs a LoRA policy; a full fine-tune keeps a frozen reference copy")
        with torch.no_grad(), self.model.disable_adapter():
            return self.token_logprobs(batch)

    def serving_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights as the serving engine's model names them (LoRA merged in); for an engine that serves
        adapters (``sync_adapters``), the adapters only, as a :class:`~polar.inference.lora.LoraAdapter`."""
        if self.lora is not None and self.sync_adapters:
            from peft import get_peft_model_state_dict

            from polar.inference.lora import LoraAdapter

            tensors = {k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(self.model).items()}
            return LoraAdapter(tensors, self.model.peft_config["default"].to_dict())
        if self.lora is None:
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.merge_adapter()
        try:
            out = {}
            for k, v in self.model.get_base_model().state_dict().items():
                if "lora_" in k:
                    continue
                out[k.replace(".base_layer.", ".")] = v.detach().clone()
            return out
        finally:
            self.model.unmerge_adapter()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)


_NO_LOGIT_MASK: set[type] = set()  # model classes whose forward took a logits_to_keep mask but did not apply it


def _base_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _keeps_logit_mask(model: Any) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (transformers' causal LMs; a boolean
    ``[B, T]`` mask keeps exactly its positions, flattened)."""
    import inspect

    base = _base_model(model)
    if type(base) in _NO_LOGIT_MASK:
        return False
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _default_targets(model: Any) -> list[str]:
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    # every projection of the blocks, attention and MLP (Llama/Qwen/Mistral names, then GPT-2's, then BERT-style)
    known = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
             "c_attn", "c_proj", "c_fc", "query", "key", "value", "dense")
    preferred = [n for n in known if n in names]
    if not preferred:
        raise ConfigError(f"cannot pick LoRA target modules for this model (linear layers: {sorted(names)}); set lora.target_modules")
    return preferred


def chat_to_sample(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, tokenizer: Any,
                   source: str = "demo") -> TrajectorySample:
    """Render a conversation with the chat template; only the assistant turns' own tokens are targets."""
    spans = []
    for k, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:k], tools=tools, tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: k + 1], tools=tools, tokenize=False)
        eot = tokenizer.eos_token or ""
        end = upto.rfind(eot) + len(eot) if eot and eot in upto[len(before):] else len(upto)
        spans.append((len(before), end))
    full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= s and e <= b and e > s for a, b in spans)) for s, e in enc["offset_mapping"]]
    n = len(enc["input_ids"])
    if not any(mask):
        raise ConfigError(f"{source}: the conversation has no assistant turn to learn from")
    return TrajectorySample(session_id=source, token_ids=list(enc["input_ids"]), loss_mask=mask, logprobs=[0.0] * n,
                            policy_versions=[0] * n, call_indices=[0] * n, reward=1.0)


def load_demonstrations(path: str | Path, tokenizer: Any) -> list[TrajectorySample]:
    """Chat JSONL (``{"messages": [...], "tools": [...]}`` per line) or a ``polar generate`` Parquet file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"demonstrations file {p} does not exist")
    if p.suffix == ".parquet":
        from polar.trajectory import read_parquet

        samples = [s for s in read_parquet(p) if any(s.loss_mask)]
    else:
        from polar.harness.agent.tasks import read_jsonl

        samples = []
        for n, row in read_jsonl(p):
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
                raise ConfigError(f"{p}:{n}: each line needs a 'messages' list (OpenAI chat format)")
            samples.append(chat_to_sample(row["messages"], row.get("tools"), tokenizer, f"{p.name}:{n}"))
    if not samples:
        raise ConfigError(f"{p} holds no usable demonstrations")
    return samples
