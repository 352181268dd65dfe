"""Supervised fine-tuning / behaviour cloning on demonstrations: masked next-token cross-entropy."""

from __future__ import annotations

import torch


def sft_loss(logits: torch.Tensor, token_ids: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> torch.Tensor:
    """Mean negative log-likelihood of ``token_ids[b, t]`` where ``mask[b, t] == 1``.

    ``mask`` marks target tokens (the assistant's own tokens), aligned with ``token_ids``; position 0
    is never a target. ``normalizer`` (masked tokens in the whole batch) makes gradient accumulation exact.
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, token_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    m = mask[:, 1:].to(nll.dtype)
    n = float(normalizer) if normalizer is not None else float(m.sum().clamp(min=1.0))
    return (nll * m).sum() / n
