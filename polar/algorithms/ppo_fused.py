"""The fused PPO update for the built-in MLP actor-critic: the loss by autograd, the MLP backward by hand.

For a 64-64 MLP on CPU, an update's time is per-kernel and autograd bookkeeping, not math. This path
runs the two MLPs (actor, critic) without recording a graph, makes their *outputs* the leaves of a
small graph, and calls the learner's loss on them (``polar.algorithms.ppo.ppo_loss``, the same call the
autograd path makes). Autograd differentiates that loss down to the outputs only (``[B, actions]`` and
``[B]`` tensors); the rest is the textbook backward of Linear + tanh/relu layers, written into each
parameter's ``.grad``. So whatever the loss says (edit ``clipped_surrogate`` and this path follows),
and the hand-written part is only the MLP's chain rule, which tests compare with autograd's.

``policy.kwargs.fused: auto`` (the default) uses it for an ``ActorCriticAgent`` with separate plain-MLP
actor and critic and a Discrete or Box action space (``supports_fused``); ``off``, and every other
agent, go through autograd end to end.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


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
        if w.grad is None:
            w.grad, b.grad = torch.zeros_like(w), torch.zeros_like(b)
        torch.mm(g.t(), acts[i], out=w.grad)
        torch.sum(g, 0, out=b.grad)
        if i > 0:
            g = g @ w


def fused_ppo_grads(agent, obs: torch.Tensor, actions: torch.Tensor,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict]]) -> dict:
    """Set ``.grad`` of every agent parameter to d(loss)/d(param) and return the loss's stats.

    ``loss_fn(log_prob, entropy, values) -> (loss, stats)`` is the learner's loss with everything but the
    network's outputs bound; it is differentiated by autograd.
    """
    pi_layers, vf_layers = agent._fast
    x = obs if obs.dtype == torch.float32 else obs.float()
    with torch.no_grad():
        pi_acts = _mlp_forward(pi_layers, x)
        vf_acts = _mlp_forward(vf_layers, x)
    pi_out = pi_acts[-1].requires_grad_()
    v_out = vf_acts[-1].requires_grad_()
    log_prob, entropy, values = agent.evaluate_outputs(pi_out, v_out.squeeze(-1), actions)
    loss, stats = loss_fn(log_prob, entropy, values)
    leaves = [pi_out, v_out, agent.log_std] if agent.gaussian else [pi_out, v_out]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    with torch.no_grad():
        _mlp_backward(pi_layers, pi_acts, grads[0] if grads[0] is not None else torch.zeros_like(pi_out))
        _mlp_backward(vf_layers, vf_acts, grads[1] if grads[1] is not None else torch.zeros_like(v_out))
        if agent.gaussian:
            g = grads[2] if grads[2] is not None else torch.zeros_like(agent.log_std)
            if agent.log_std.grad is None:
                agent.log_std.grad = g.clone()
            else:
                agent.log_std.grad.copy_(g)
    return stats


def supports_fused(agent) -> bool:
    """True for the built-in MLP actor-critic with separate plain-MLP actor and critic (Discrete or Box actions)."""
    return (getattr(agent, "_fast", None) is not None and hasattr(agent, "evaluate_outputs")
            and (getattr(agent, "_categorical", False) or getattr(agent, "gaussian", False)))
