"""Hand-derived PPO gradients for the built-in MLP actor-critic, used only while the loss is the stock one.

For a 64-64 MLP on CPU, PPO's update time is per-kernel and autograd bookkeeping overhead, not math.
This path runs the forward pass without recording a graph and writes the analytic gradients of the
stock PPO loss (``polar.algorithms.ppo.ppo_loss``: clipped surrogate, optionally clipped value loss,
entropy bonus; the built-in agent's log-prob and entropy) straight into the parameters' ``.grad``
tensors, including torch's tie rule for ``min`` of the clipped and unclipped terms. Tests check it
equals autograd's gradient of ``ppo_loss``; ``benchmarks/ppo_update_paths.py`` measures what it saves.

It stands for the loss it was derived from, so it is used only while that loss is unchanged:
``DERIVED_FROM`` pins the source of every function the derivation covers (a hash of its tokens,
comments and docstrings left out). ``policy.kwargs.fused: auto`` (the default) takes this path for an
``ActorCriticAgent`` with separate plain-MLP actor and critic and Discrete or Box actions *and* the
stock loss; when any of those functions is edited or replaced it runs autograd and the run log names
what changed. ``fused: off`` always runs autograd. Whoever changes the stock loss on purpose re-derives
this file and updates ``DERIVED_FROM`` (``tests/algorithms/test_one_ppo.py`` prints the new values).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import math
import textwrap
import tokenize
from collections.abc import Callable

import torch

_LOG_2PI = math.log(2 * math.pi)

# qualname -> sha256[:16] of the function's tokens (see source_fingerprint); the functions are listed
# in polar.algorithms.ppo.stock_loss_functions
DERIVED_FROM: dict[str, str] = {
    "ppo_loss": "203f61ca0c45e44f",
    "clipped_surrogate": "9d8e6c4cddd5b108",
    "ppo_value_loss": "c345c4505e0fc1e7",
    "clip_fraction": "4202d60347a17129",
    "normalize": "30b61aa8c12e7b8c",
    "GaussianDist.log_prob": "e33dfdc8b4916f9f",
    "GaussianDist.entropy": "bc11d4660615a6d6",
    "gaussian_log_prob": "58407c4d33d4bfc5",
    "gaussian_entropy": "3a06789d670dfd70",
    "ActorCriticAgent.evaluate_outputs": "9dd782188caab8a9",
}


def source_fingerprint(fn: Callable) -> str:
    """A hash of ``fn``'s source tokens without comments, blank lines and docstrings ("?" if unreadable).

    Stable across Python versions and reformatting-insensitive only where tokens do not change."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        lines: list[str] = []
        line: list[tuple[int, str]] = []
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER):
                continue
            if tok.type == tokenize.NEWLINE:
                if not (len(line) == 1 and line[0][0] == tokenize.STRING):  # a docstring: no effect
                    lines.append(" ".join(s for _, s in line))
                line = []
            elif tok.type in (tokenize.INDENT, tokenize.DEDENT):
                lines.append("<indent>" if tok.type == tokenize.INDENT else "<dedent>")
            else:
                line.append((tok.type, tok.string))
    except (OSError, TypeError, tokenize.TokenError):
        return "?"
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def changed_functions(functions: dict[str, Callable]) -> list[str]:
    """Names of the functions whose source differs from the one the gradients were derived from."""
    return [name for name, fn in functions.items() if DERIVED_FROM.get(name) != source_fingerprint(fn)]


def _mlp_forward(layers, x):
    """Activations [x, h1, ..., out] of a plain MLP (tanh/relu hidden layers, linear output)."""
    acts = [x]
    for w, b, f in layers:
        x = torch.addmm(b, x, w.t())
        if f is not None:
            x = f(x)
        acts.append(x)
    return acts


def _mlp_backward(layers, acts, g: torch.Tensor) -> None:
    """Backprop ``g`` (d loss / d output) through the MLP, writing weight/bias grads in place."""
    for i in range(len(layers) - 1, -1, -1):
        w, b, f = layers[i]
        out = acts[i + 1]
        if f is torch.tanh:
            g = torch.ops.aten.tanh_backward(g, out)
        elif f is torch.relu:
            g = g * (out > 0)
        if w.grad is None:  # an optimizer that sets grads to None between steps
            w.grad, b.grad = torch.zeros_like(w), torch.zeros_like(b)
        torch.mm(g.t(), acts[i], out=w.grad)
        torch.sum(g, 0, out=b.grad)
        if i > 0:
            g = g @ w


@torch.no_grad()
def fused_ppo_grads(agent, obs, actions, old_log_prob, old_values, advantages, returns, clip_range: float,
                    clip_range_vf: float | None, ent_coef: float, vf_coef: float, with_stats: bool) -> dict:
    """Set ``.grad`` of every agent parameter to d(ppo_loss)/d(param); return diagnostics if asked."""
    pi_layers, vf_layers = agent._fast
    x = obs if obs.dtype == torch.float32 else obs.float()
    n = x.shape[0]
    pi_acts = _mlp_forward(pi_layers, x)
    vf_acts = _mlp_forward(vf_layers, x)
    out = pi_acts[-1]
    values = vf_acts[-1].squeeze(-1)

    if agent._categorical:
        logp_all = torch.log_softmax(out, -1)
        a = actions.long().unsqueeze(-1)
        logp = logp_all.gather(-1, a).squeeze(-1)
        probs = logp_all.exp()
        entropy = -(probs * logp_all).sum(-1)
    else:
        log_std = agent.log_std
        inv_var = torch.exp(-2 * log_std)
        diff = actions.reshape(out.shape) - out
        logp = (-0.5 * diff * diff * inv_var - log_std).sum(-1) - 0.5 * _LOG_2PI * out.shape[-1]
        entropy = (0.5 + 0.5 * _LOG_2PI + log_std).sum().expand(n)

    # d loss / d log_prob: the clipped surrogate, with torch.min's tie rule and clamp's inclusive bounds
    ratio = torch.exp(logp - old_log_prob)
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    surr1, surr2 = advantages * ratio, advantages * clipped
    in_range = (ratio >= 1.0 - clip_range) & (ratio <= 1.0 + clip_range)
    active = (surr1 < surr2) | in_range
    g_logp = advantages * ratio * active * (-1.0 / n)

    # d loss / d value
    if clip_range_vf is not None:
        dv = values - old_values
        v_pred = old_values + torch.clamp(dv, -clip_range_vf, clip_range_vf)
        g_v = (v_pred - returns) * ((dv >= -clip_range_vf) & (dv <= clip_range_vf)) * (2.0 * vf_coef / n)
    else:
        v_pred = values
        g_v = (values - returns) * (2.0 * vf_coef / n)

    if agent._categorical:
        g_out = probs * (-g_logp).unsqueeze(-1)
        g_out.scatter_add_(-1, a, g_logp.unsqueeze(-1))
        if ent_coef != 0.0:
            g_out += (ent_coef / n) * probs * (logp_all + entropy.unsqueeze(-1))
    else:
        g_out = diff * inv_var * g_logp.unsqueeze(-1)
        g_log_std = (g_logp.unsqueeze(-1) * (diff * diff * inv_var - 1)).sum(0) - ent_coef
        if agent.log_std.grad is None:
            agent.log_std.grad = torch.zeros_like(agent.log_std)
        agent.log_std.grad.copy_(g_log_std)

    _mlp_backward(pi_layers, pi_acts, g_out)
    _mlp_backward(vf_layers, vf_acts, g_v.unsqueeze(-1))

    if not with_stats:
        return {}
    log_ratio = logp - old_log_prob
    return {"pg_loss": -torch.min(surr1, surr2).mean(), "value_loss": (returns - v_pred).pow(2).mean(),
            "entropy": entropy.mean(), "approx_kl": ((ratio - 1) - log_ratio).mean(),
            "clip_fraction": ((ratio - 1.0).abs() > clip_range).float().mean()}


def supports_fused(agent) -> bool:
    """True for the built-in MLP actor-critic with separate plain-MLP actor and critic (Discrete or Box actions)."""
    return getattr(agent, "_fast", None) is not None and (getattr(agent, "_categorical", False) or getattr(agent, "gaussian", False))
