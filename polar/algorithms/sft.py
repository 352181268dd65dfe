"""Supervised fine-tuning / behaviour cloning on demonstrations: masked next-token cross-entropy (``sft_loss``),
and ``SFTLearner``, its learner (``polar.types.Learner[list[TrajectorySample]]``): one optimizer step per
minibatch of demonstrations (``demonstration_batches``, fed by
``polar.rollout.sessions.collector.DemonstrationCollector``). An SFT run, and GRPO's SFT warm-up, are this
learner as a stage of the one loop."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from polar.algorithms.grpo import TokenPolicy
from polar.config.grpo import SFTKwargs
from polar.types import Batch, Metrics, TrajectorySample


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


class SFTLearner:
    """Behaviour cloning: one optimizer step of masked cross-entropy per minibatch of demonstrations."""

    def __init__(self, policy: TokenPolicy, kwargs: SFTKwargs) -> None:
        self.policy = policy
        self.kw = kwargs
        self.params = policy.parameters()
        self.optimizer = torch.optim.AdamW(self.params, lr=kwargs.learning_rate, weight_decay=0.0)
        # data-parallel learners (polar.distributed.data_parallel): averages the gradient over the group before
        # each step, weighted by each learner's target tokens, so N shards take one learner's token-mean step
        self.grad_sync: Callable[[Sequence[torch.nn.Parameter], float], float] | None = None

    def update(self, batch: Batch[list[TrajectorySample]]) -> Metrics:
        """One optimizer step on ``batch.data``, a minibatch of demonstrations."""
        return dict(self.optimize(batch.data))

    def optimize(self, samples: list[TrajectorySample]) -> dict[str, float]:
        pol = self.policy
        pol.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        n_tokens, sft = 0.0, 0.0
        if samples:  # a learner group's rank may be dealt no demonstration: it joins the all-reduce with weight 0
            batch = pol.collate(samples)
            n_tokens = float(batch.loss_mask[:, 1:].sum())
            loss = sft_loss(pol.logits(batch), batch.token_ids, batch.loss_mask)
            loss.backward()
            sft = loss.item()
        if self.grad_sync is not None and self.grad_sync(self.params, n_tokens) <= 0:
            return {"sft_loss": sft, "grad_norm": 0.0, "trained_tokens": n_tokens}  # no rank had a target token
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.kw.max_grad_norm)
        self.optimizer.step()
        return {"sft_loss": sft, "grad_norm": float(grad_norm), "trained_tokens": n_tokens}

    def weights(self) -> Mapping[str, Any]:
        """What the engine serves: the policy's weights (LoRA merged)."""
        return self.policy.serving_state_dict()

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "model" in state:
            self.policy.load_state_dict(dict(state["model"]))
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])


def sft_steps(demonstrations: int, kwargs: SFTKwargs) -> int:
    """How many minibatches ``demonstration_batches`` yields for ``demonstrations`` samples."""
    per_epoch = -(-demonstrations // kwargs.batch_size)
    total = per_epoch * kwargs.epochs
    return min(total, kwargs.max_steps) if kwargs.max_steps else total


def demonstration_batches(samples: list[TrajectorySample], kwargs: SFTKwargs, seed: int = 0
                          ) -> Iterator[list[TrajectorySample]]:
    """Minibatches of ``batch_size`` demonstrations, reshuffled every epoch, ``max_steps`` at most (0: all epochs)."""
    rng = random.Random(seed)
    step = 0
    for _ in range(kwargs.epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        for start in range(0, len(order), kwargs.batch_size):
            yield [samples[i] for i in order[start:start + kwargs.batch_size]]
            step += 1
            if kwargs.max_steps and step >= kwargs.max_steps:
                return


def sft_train(policy: TokenPolicy, samples: list[TrajectorySample], kwargs: SFTKwargs, seed: int = 0,
              on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Behaviour cloning over ``samples`` (``SFTLearner`` on ``demonstration_batches``). Returns the losses."""
    learner = SFTLearner(policy, kwargs)
    losses: list[float] = []
    for step, batch in enumerate(demonstration_batches(samples, kwargs, seed), start=1):
        losses.append(learner.optimize(batch)["sft_loss"])
        if on_step is not None:
            on_step(step, losses[-1])
    return losses
