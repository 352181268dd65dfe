"""The fused PPO path: hand-derived gradients for the built-in MLP actor-critic, used only while the code
they stand for is the stock one.

For a 64-64 MLP on CPU, PPO's update time is per-kernel and autograd bookkeeping overhead, not math.
``PPOLearner.update`` takes one gradient step per minibatch through ``polar.algorithms.ppo.autograd_step``
(``evaluate_actions``, ``ppo_loss``, ``backward``); ``fused_step`` here replaces exactly that function: it
runs the forward pass without recording a graph and writes the analytic gradient of the same loss straight
into the parameters' ``.grad`` tensors, including torch's tie rule for ``min`` of the clipped and unclipped
terms. Everything else in ``update`` (the minibatches, clipping, the optimizer step, whatever a user adds
there) runs on both paths. The numpy acting path (``ActorCriticAgent.act_numpy``) is the same kind of twin
of ``act``, behind the same switch. Tests check both equal their torch originals;
``benchmarks/ppo_update_paths.py`` and ``benchmarks/ppo_fused_share.py`` measure what they save.

Both twins stand for the code they were derived from, so they run only while it is unchanged:
``DERIVED_FROM`` pins the source of ``autograd_step``, the agent's ``act``, ``evaluate_actions`` and
``evaluate_outputs``, the Gaussian distribution's methods, and every function those call by a module-level
name, transitively (``pinned_changes``; a hash of each function's tokens, comments and docstrings left
out). ``policy.kwargs.fused: auto`` (the default) takes the fused path for an ``ActorCriticAgent`` with
separate plain-MLP actor and critic and Discrete or Box actions *and* the stock code; when any pinned
function is edited or replaced the run trains by autograd and acts through ``act``, and the run log names
what changed. ``fused: off`` always does. Whoever changes the pinned code on purpose re-derives this file
(and ``act_numpy`` for an ``act`` change) and updates ``DERIVED_FROM`` (``tests/algorithms/test_one_ppo.py``
prints the new values).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import math
import textwrap
import tokenize
from collections.abc import Callable
from types import CodeType

import numpy as np
import torch

_LOG_2PI = math.log(2 * math.pi)

# name -> sha256[:16] of the function's tokens (see source_fingerprint). The roots are listed in
# polar.algorithms.ppo.fused_pins; the rest are what they call by a module-level name (pinned_changes).
DERIVED_FROM: dict[str, str] = {
    # the gradient: polar.algorithms.ppo.autograd_step and what it calls
    "autograd_step": "8586b4b9a1b0108e",
    "ppo_loss": "203f61ca0c45e44f",
    "clipped_surrogate": "9d8e6c4cddd5b108",
    "ppo_value_loss": "c345c4505e0fc1e7",
    "clip_fraction": "4202d60347a17129",
    "normalize": "30b61aa8c12e7b8c",
    # the agent (polar.models.actor_critic) and its distribution (polar.distributions)
    "ActorCriticAgent.act": "91f4244a16d1288f",
    "ActorCriticAgent.evaluate_actions": "a6d092047391ce0c",
    "ActorCriticAgent.evaluate_outputs": "9dd782188caab8a9",
    "_run_layers": "930efd7088146172",
    "gumbel_argmax": "9b623cb426c05c18",
    "reset_state": "1b66b6358e5d142e",
    "GaussianDist.sample": "e0ac1bb548d386d8",
    "GaussianDist.log_prob": "e33dfdc8b4916f9f",
    "GaussianDist.entropy": "bc11d4660615a6d6",
    "gaussian_log_prob": "58407c4d33d4bfc5",
    "gaussian_entropy": "3a06789d670dfd70",
}


_FINGERPRINTS: dict[CodeType, str] = {}  # code object -> its fingerprint: the learner and the runner both check


def source_fingerprint(fn: Callable) -> str:
    """A hash of ``fn``'s source tokens without comments, blank lines and docstrings ("?" if unreadable).

    Stable across Python versions and reformatting-insensitive only where tokens do not change. Kept per code
    object (a replaced or re-defined function has a new one), so a run's second check reads no source."""
    code = getattr(inspect.unwrap(getattr(fn, "__func__", fn)), "__code__", None)
    if not isinstance(code, CodeType):
        return _source_fingerprint(fn)
    if code not in _FINGERPRINTS:
        _FINGERPRINTS[code] = _source_fingerprint(fn)
    return _FINGERPRINTS[code]


def _source_fingerprint(fn: Callable) -> str:
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


def changed_methods(cls: type, derived_from: dict[str, str]) -> list[str]:
    """The methods of ``cls`` named in ``derived_from`` whose source (``cls``'s own or inherited) is no longer
    the one a numpy twin was derived from (``QNetworkAgent.act_numpy_derived_from``)."""
    return [f"{cls.__name__}.{name}" for name, fingerprint in derived_from.items()
            if not callable(method := getattr(cls, name, None)) or source_fingerprint(method) != fingerprint]


def _global_names(code: CodeType) -> set[str]:
    """Every name ``code`` and the functions nested in it look up (globals among them)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _global_names(const)
    return names


def _called_functions(fn: object) -> dict[str, object]:
    """The module-level objects ``fn`` refers to by name that are polar's Python functions or pinned names."""
    fn = getattr(fn, "__func__", fn)
    if callable(fn):
        fn = inspect.unwrap(fn)
    code, module_globals = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    if code is None or module_globals is None:
        return {}
    out: dict[str, object] = {}
    for name in sorted(_global_names(code)):
        if name not in module_globals:
            continue
        obj = module_globals[name]
        if name in DERIVED_FROM or (inspect.isfunction(obj) and obj.__module__.startswith("polar.")):
            out[name] = obj
    return out


def pinned_changes(roots: dict[str, object]) -> list[str]:
    """Names of the pinned functions whose source differs from the one the fused path was derived from.

    Starts at ``roots`` and follows every function an unchanged one calls by a module-level name (so an
    edited helper, or a module global rebound to another function, counts); a changed function is named
    and not followed further: the run leaves the fused path anyway."""
    changed: list[str] = []
    seen: set[str] = set()
    todo: list[tuple[str, object]] = list(roots.items())
    while todo:
        name, fn = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if not callable(fn) or DERIVED_FROM.get(name) != source_fingerprint(fn):
            changed.append(name)
            continue
        todo.extend(_called_functions(fn).items())
    return changed


def pinned_fingerprints(roots: dict[str, object]) -> dict[str, str]:
    """What ``DERIVED_FROM`` should be for the code as it is now (the closure of ``roots``, as
    ``pinned_changes`` walks it): printed by the test that fails when the pinned code changes."""
    out: dict[str, str] = {}
    todo: list[tuple[str, object]] = list(roots.items())
    while todo:
        name, fn = todo.pop(0)
        if name in out or not callable(fn):
            continue
        out[name] = source_fingerprint(fn)
        todo.extend(_called_functions(fn).items())
    return out


def _tanh_(x: torch.Tensor) -> torch.Tensor:
    """``torch.tanh(x)`` to within an ulp, in place. A float32 CPU tensor goes through numpy's tanh: torch's
    CPU kernel is ~7x slower (87 vs 12 us for a 256 x 64 minibatch activation, 2 CPU cores, torch 2.13), and the
    fused update is four of these per gradient step. Acting (``run_numpy``) already uses numpy's."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and not x.requires_grad:
        xn = x.numpy()
        np.tanh(xn, out=xn)
        return x
    return x.tanh_()


def _mlp_forward(layers, x):
    """Activations [x, h1, ..., out] of a plain MLP (tanh/relu hidden layers, linear output)."""
    acts = [x]
    for w, b, f in layers:
        x = torch.addmm(b, x, w.t())
        if f is torch.tanh:
            x = _tanh_(x)  # x is addmm's fresh output: nothing else holds it
        elif f is not None:
            x = f(x)
        acts.append(x)
    return acts


def _weight_grad(g: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> None:
    """``out = g.T @ x`` (a layer's weight gradient). float32 CPU tensors go through numpy's BLAS: for the first
    layer's narrow [hidden, obs_dim] output torch's CPU matmul is ~12x slower (21 vs 1.8 us for 256 samples and 4
    inputs), and no slower for the rest."""
    if (out.device.type == "cpu" and g.dtype == x.dtype == out.dtype == torch.float32 and out.is_contiguous()
            and not (g.requires_grad or x.requires_grad)):
        np.dot(g.numpy().T, x.numpy(), out=out.numpy())
    else:
        torch.mm(g.t(), x, out=out)


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
        _weight_grad(g, acts[i], w.grad)
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
    """True for the built-in MLP actor-critic with separate plain-MLP actor and critic (Discrete or Box actions)
    whose hidden activations are the ones ``_mlp_backward`` differentiates (tanh, relu)."""
    fast = getattr(agent, "_fast", None)
    if fast is None or not (getattr(agent, "_categorical", False) or getattr(agent, "gaussian", False)):
        return False
    return all(f is None or f in (torch.tanh, torch.relu) for layers in fast for _, _, f in layers)
