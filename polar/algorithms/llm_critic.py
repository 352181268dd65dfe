"""A critic over the LLM's hidden states (``policy.kwargs.advantage: value_head``): the head, the turns of a
sample, the advantages and the value loss. Pure functions, no I/O; ``polar.algorithms.grpo.GRPOLearner``
does the forward passes.

A turn is one model call's sampled tokens: a run of ``mask == 1`` in a sample (a prefix-merged multi-turn
sample holds several). The state a turn acted from is the position just before its first sampled token
(the hidden state that predicted it); ``ValueHead`` maps the LLM's last hidden state there to V(turn).

The sessions carry one reward each (for LLM env runs, the episode's shaped return), no per-turn rewards, so
every turn's return is its session's reward (Monte Carlo, gamma 1) and its advantage is ``R - V(turn)``,
optionally normalised over the step's turns; every sampled token of a turn carries its turn's advantage.
The value loss is PPO's (``polar.algorithms.ppo.ppo_value_loss``: MSE to the return, optionally clipped
around the value before the update).
"""

from __future__ import annotations

import torch
from torch import nn

from polar.algorithms.advantages import normalize


class ValueHead(nn.Module):
    """V(state) from a hidden state ``[..., in_features]``: a linear layer, or one hidden layer of
    ``hidden_units`` tanh units. The output layer starts at zero, so every value starts at 0 (the first
    step's advantages are the returns themselves)."""

    def __init__(self, in_features: int, hidden_units: int = 0) -> None:
        super().__init__()
        out = nn.Linear(hidden_units or in_features, 1)
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)
        self.net: nn.Module = nn.Sequential(nn.Linear(in_features, hidden_units), nn.Tanh(), out) if hidden_units else out

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden.float()).squeeze(-1)


def turn_starts(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: True at each turn's first sampled token (``mask`` 1 where the token before is 0)."""
    m = mask > 0
    before = torch.nn.functional.pad(m[:, :-1], (1, 0), value=False)
    return m & ~before


def state_positions(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of every turn's state, the position just before its first sampled token, in row-major
    order (sample by sample, turn by turn): the order ``turn_index`` numbers the turns in."""
    starts = turn_starts(mask)
    if bool(starts[:, 0].any()):
        raise ValueError("a turn starts at position 0, so no state precedes it (collate masks position 0)")
    rows, cols = starts.nonzero(as_tuple=True)
    return rows, cols - 1


def turns_per_row(mask: torch.Tensor) -> list[int]:
    """How many turns each sample of ``mask`` holds."""
    return [int(n) for n in turn_starts(mask).sum(dim=1)]


def turn_index(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` long: each sampled token's turn, numbered over the whole batch in ``state_positions``'
    order; -1 where ``mask`` is 0."""
    starts = turn_starts(mask).long()
    ids = starts.flatten().cumsum(0).view_as(starts) - 1
    return torch.where(mask > 0, ids, torch.full_like(ids, -1))


def per_token(turn_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: each sampled token gets its turn's entry of ``turn_values`` (one per turn, in
    ``state_positions``' order); 0 where ``mask`` is 0."""
    idx = turn_index(mask)
    picked = turn_values[idx.clamp(min=0)]
    return torch.where(idx >= 0, picked, torch.zeros_like(picked))


def value_advantages(returns: torch.Tensor, values: torch.Tensor, normalize_advantage: bool = True) -> torch.Tensor:
    """``R - V`` per turn (Monte Carlo, gamma 1), then zero mean and unit std over the turns when
    ``normalize_advantage`` (PPO's ``normalize``: a single turn is left as it is)."""
    adv = returns.float() - values.float()
    return normalize(adv) if normalize_advantage else adv


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` as PPO logs it: 1 predicts every return, 0 no better than their mean,
    below 0 worse; NaN when the returns do not vary."""
    if returns.numel() < 2:
        return float("nan")
    var_y = returns.float().var()
    if float(var_y) == 0.0:
        return float("nan")
    return float(1.0 - (returns.float() - values.float()).var() / var_y)


__all__ = ["ValueHead", "explained_variance", "per_token", "state_positions", "turn_index", "turn_starts",
           "turns_per_row", "value_advantages"]
