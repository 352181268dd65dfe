"""Sampling and scoring on logits: the two places where "which logprob" is decided.

Both use the raw model distribution (log-softmax at temperature 1) for the reported logprob, so a
recorded logprob and a recomputed one are the same quantity.
"""

from __future__ import annotations

from typing import Any

import torch


def sample_rows(
    logits: torch.Tensor, temperatures: list[float], top_ps: list[float], generators: list[torch.Generator]
) -> tuple[list[int], list[float]]:
    """Sample one id per row of float32 ``logits`` (B, V); return the ids and their raw-model logprobs.

    Gumbel-max over the tempered, top-p-filtered logits: exact sampling, batched, with each row's noise
    drawn from its own generator (so a seeded request gives the same tokens whatever it is batched
    with). Temperature 0 is greedy. One device-to-host copy per call.
    """
    raw = torch.log_softmax(logits, dim=-1)
    device = logits.device
    temps = torch.tensor(temperatures, dtype=logits.dtype, device=device)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    if any(p < 1.0 for p in top_ps):
        top_p = torch.tensor(top_ps, dtype=logits.dtype, device=device)[:, None]
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        drop_sorted = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= top_p  # never drops the top id
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    noise = torch.stack([torch.rand(logits.shape[-1], generator=g, device=device) for g in generators])
    gumbel = -torch.log(-torch.log(noise.clamp(min=1e-20, max=1.0 - 1e-7)))
    choice = torch.where(greedy, logits.argmax(dim=-1), (scaled + gumbel).argmax(dim=-1))
    picked = raw.gather(1, choice[:, None])[:, 0]
    both = torch.stack([choice.to(torch.float64), picked.to(torch.float64)]).cpu()
    return [int(t) for t in both[0].tolist()], both[1].tolist()


def sequence_logprobs(model: Any, token_ids: list[int]) -> list[float]:
    """Raw-model logprob of ``token_ids[i]`` given ``token_ids[:i]`` for i >= 1 (one plain forward pass)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        ids = torch.tensor([token_ids], dtype=torch.long, device=device)
        logits = model(input_ids=ids).logits[0, :-1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp.cpu().tolist()


def top_rows(logits: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """The ``k`` most likely ids of each row of float32 ``logits`` (B, V) with their raw-model logprobs."""
    values, ids = torch.log_softmax(logits, dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
    return [list(zip(r_ids, r_vals, strict=True)) for r_ids, r_vals in zip(ids.cpu().tolist(), values.cpu().tolist(), strict=True)]


def sequence_top_logprobs(model: Any, token_ids: list[int], start: int, k: int) -> list[list[tuple[int, float]]]:
    """For each position i >= ``start`` of ``token_ids``: the ``k`` most likely ids given ``token_ids[:i]``."""
    device = next(model.parameters()).device
    with torch.no_grad():
        ids = torch.tensor([token_ids], dtype=torch.long, device=device)
        logits = model(input_ids=ids).logits[0, start - 1 : -1].float()
    return top_rows(logits, k)
