"""A lean Adam over one flat parameter buffer, a grad-norm clip, and Polyak target updates.

Same math as ``torch.optim.Adam`` (no weight decay, no amsgrad) and ``torch.nn.utils.clip_grad_norm_``
(tests compare them). Two reasons not to use torch.optim here, measured by
``benchmarks/ppo_update_paths.py`` (docs/benchmarks.md, "PPO update paths"):

- constructing any ``torch.optim.Optimizer`` imports the ``torch._dynamo`` compiler stack, which costs
  seconds of start-up on a small CPU box (4 s idle, 11-12 s loaded, here; a PPO/DQN/SAC run imports it
  nowhere else);
- small policies are dominated by per-kernel overhead. The parameters are re-pointed into one flat
  tensor and their ``.grad`` into views of one flat gradient (autograd accumulates into them in place),
  so zeroing, clipping and the Adam update are a handful of kernels instead of a few per parameter:
  on PPO's default CartPole update, 1.7x the optimizer steps per CPU second of
  ``torch.optim.Adam(foreach=True)`` with autograd gradients, 1.9x with the fused ones.

A parameter that gets no gradient in a step is updated with a zero gradient (torch skips it); for
actor-critic losses every parameter gets one.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter (or buffer), where its learner trains it (the trainer put
    it on ``polar.trainers.device.learner_device``); CPU for a module with neither."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return torch.device("cpu")


class Adam:
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.step_count = 0
        n = sum(p.numel() for p in self.params)
        dtype = self.params[0].dtype if self.params else torch.float32
        device = self.params[0].device if self.params else torch.device("cpu")  # the learner's device
        self.flat = torch.empty(n, dtype=dtype, device=device)
        self.flat_grad = torch.zeros(n, dtype=dtype, device=device)
        off = 0
        with torch.no_grad():
            for p in self.params:
                k = p.numel()
                self.flat[off:off + k].copy_(p.reshape(-1))
                p.data = self.flat[off:off + k].view_as(p)
                p.grad = self.flat_grad[off:off + k].view_as(p)
                off += k
        self.exp_avg = torch.zeros(n, dtype=dtype, device=device)
        self.exp_avg_sq = torch.zeros(n, dtype=dtype, device=device)

    def zero_grad(self) -> None:
        self._reattach_if_moved()
        self.flat_grad.zero_()

    def _reattach(self) -> None:
        off = 0
        for p in self.params:
            k = p.numel()
            if p.grad is not None and p.grad.data_ptr() != self.flat_grad[off:off + k].data_ptr():
                self.flat_grad[off:off + k].copy_(p.grad.reshape(-1))
            p.grad = self.flat_grad[off:off + k].view_as(p)
            off += k

    @torch.no_grad()
    def step(self) -> None:
        self._reattach_if_moved()
        g = self.flat_grad
        self.step_count += 1
        self.exp_avg.lerp_(g, 1 - self.beta1)
        self.exp_avg_sq.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
        bc1 = 1 - self.beta1 ** self.step_count
        bc2_sqrt = math.sqrt(1 - self.beta2 ** self.step_count)
        denom = (self.exp_avg_sq.sqrt() / bc2_sqrt).add_(self.eps)
        self.flat.addcdiv_(self.exp_avg, denom, value=-self.lr / bc1)

    def _reattach_if_moved(self) -> None:
        p = self.params[0] if self.params else None
        if p is not None and (p.grad is None or p.grad.data_ptr() != self.flat_grad.data_ptr()):
            self._reattach()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the flat gradient so its L2 norm is at most ``max_norm``; returns the norm before."""
        self._reattach_if_moved()
        with torch.no_grad():
            total = torch.linalg.vector_norm(self.flat_grad)
            self.flat_grad.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        return total

    def state_dict(self) -> dict:
        return {"step": self.step_count, "lr": self.lr, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}

    def load_state_dict(self, state: dict) -> None:
        if state["exp_avg"].numel() != self.exp_avg.numel():
            raise ValueError(f"optimizer state has {state['exp_avg'].numel()} values, the model {self.exp_avg.numel()}")
        self.step_count = int(state["step"])
        self.lr = float(state["lr"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])


@torch.no_grad()
def clip_grad_norm_(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients in place so their global L2 norm is at most ``max_norm``; returns the norm before."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, coef)
    return total


def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online, parameters and buffers alike (tau = 1: hard copy)."""
    polyak_update_tensors(list(target.parameters()) + list(target.buffers()),
                          list(online.parameters()) + list(online.buffers()), tau)


@torch.no_grad()
def polyak_update_tensors(targets: list[torch.Tensor], sources: list[torch.Tensor], tau: float) -> None:
    if tau >= 1.0:
        torch._foreach_copy_(targets, sources)
    else:
        torch._foreach_lerp_(targets, sources, tau)
