"""A lean Adam and grad-norm clip on ``torch._foreach_*`` ops.

Same math as ``torch.optim.Adam(foreach=True)`` (no weight decay, no amsgrad) and
``torch.nn.utils.clip_grad_norm_``. Why not torch.optim: constructing any ``torch.optim.Optimizer``
imports the ``torch._dynamo`` compiler stack, which costs seconds of start-up on a small CPU box —
longer than training CartPole. Checkpoints hold plain tensors (``state_dict``).
"""

from __future__ import annotations

import math

import torch


class Adam:
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        params = [p for p in self.params if p.grad is not None]
        if not params:
            return
        if len(params) != len(self.params):
            idx = [i for i, p in enumerate(self.params) if p.grad is not None]
            m = [self.exp_avg[i] for i in idx]
            v = [self.exp_avg_sq[i] for i in idx]
        else:
            m, v = self.exp_avg, self.exp_avg_sq
        grads = [p.grad for p in params]
        self.step_count += 1
        torch._foreach_lerp_(m, grads, 1 - self.beta1)
        torch._foreach_mul_(v, self.beta2)
        torch._foreach_addcmul_(v, grads, grads, 1 - self.beta2)
        bc1 = 1 - self.beta1 ** self.step_count
        bc2_sqrt = math.sqrt(1 - self.beta2 ** self.step_count)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, m, denom, -self.lr / bc1)

    def state_dict(self) -> dict:
        return {"step": self.step_count, "lr": self.lr, "exp_avg": list(self.exp_avg), "exp_avg_sq": list(self.exp_avg_sq)}

    def load_state_dict(self, state: dict) -> None:
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(state['exp_avg'])} tensors, the model {len(self.params)}")
        self.step_count = int(state["step"])
        self.lr = float(state["lr"])
        with torch.no_grad():
            for dst, src in zip(self.exp_avg + self.exp_avg_sq, list(state["exp_avg"]) + list(state["exp_avg_sq"]), strict=True):
                dst.copy_(src)


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
