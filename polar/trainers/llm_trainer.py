"""GRPO and SFT for LLM agents behind the gateway.

The GRPO loop (one optimizer step per iteration)::

    collect  tasks_per_step groups of group_size sessions (harness → gateway → verifier)
    filter   drop ERROR/CANCELLED sessions and groups older than max_off_policy_steps versions
    learn    group-relative advantages; clipped ratio vs the engine's recorded logprobs; KL to reference;
             gradient accumulation over micro-batches (token-level normalization over the whole batch)
    publish  weights → engine through the gateway's drain (pause, wait in-flight, swap, resume, version+1);
             a step with no usable group (all filtered, or equal rewards in every group) updates nothing,
             publishes nothing and is logged with ``update_skipped: 1``
    checkpoint

With ``max_off_policy_steps >= 1`` the next batch is collected while this one trains (asynchronous
rollouts); its sessions may straddle a weight swap, and each sample's oldest policy version decides
whether it is still fresh enough.
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from polar.algorithms.grpo import group_advantages, grpo_loss, token_logprobs
from polar.algorithms.sft import sft_loss
from polar.models.llm_policy import LLMPolicy, collate
from polar.rollout.sessions.session import SessionResult, SessionStatus
from polar.trainers.lifecycle import stop_requested, stopped_after_checkpoint
from polar.types import TrajectorySample

log = logging.getLogger(__name__)

Groups = list[list[SessionResult]]


def group_batch(groups: Groups, current_version: int, max_off_policy_steps: int, advantage: str
                ) -> tuple[list[TrajectorySample], list[float], dict[str, float]]:
    """Trainable samples with one advantage each (per session, shared by its samples), plus counts."""
    samples: list[TrajectorySample] = []
    advs: list[float] = []
    stats = defaultdict(float)
    for group in groups:
        usable = [r for r in group if r.status in (SessionStatus.DONE, SessionStatus.TIMEOUT) and r.reward is not None]
        stats["sessions"] += len(group)
        stats["sessions_error"] += sum(r.status == SessionStatus.ERROR for r in group)
        stats["sessions_timeout"] += sum(r.status == SessionStatus.TIMEOUT for r in group)
        oldest = min((s.metadata.get("min_policy_version", 0) for r in usable for s in r.samples), default=current_version)
        if current_version - oldest > max_off_policy_steps:
            stats["groups_stale"] += 1
            continue
        if len(usable) < 2:
            stats["groups_too_small"] += 1
            continue
        adv = group_advantages(torch.tensor([r.reward for r in usable]), advantage)
        if float(adv.abs().max()) == 0.0:
            stats["groups_no_signal"] += 1
            continue
        stats["groups_used"] += 1
        for r, a in zip(usable, adv.tolist(), strict=True):
            for s in r.samples:
                if any(s.loss_mask):
                    samples.append(s)
                    advs.append(a)
    return samples, advs, dict(stats)


class GRPOLearner:
    """The update: policy + optimizer + (optional) reference for the KL term. Knows nothing about sessions.

    The reference exists only when ``kl_coef > 0``: with LoRA it is the policy's own base weights with
    the adapters switched off (``reference_kind == "adapters_off"``, no extra memory); a full fine-tune
    keeps one frozen copy of the starting model (``"frozen_copy"``, in ``self.reference``)."""

    def __init__(self, policy: LLMPolicy, kwargs: Any) -> None:
        self.policy = policy
        self.kw = kwargs
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=kwargs.learning_rate, weight_decay=0.0)
        self.reference = None
        self.reference_kind = "none"
        if kwargs.kl_coef > 0 and policy.lora is not None:
            self.reference_kind = "adapters_off"
        elif kwargs.kl_coef > 0:
            import copy

            self.reference = copy.deepcopy(policy.model).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
            self.reference_kind = "frozen_copy"

    def reference_logprobs(self, batch: Any) -> torch.Tensor | None:
        """Per-token logprobs of the reference over ``batch`` (no grad), or None without a KL term."""
        if self.reference_kind == "none":
            return None
        if self.reference_kind == "adapters_off":
            return token_logprobs(self.policy.base_logits(batch), batch.token_ids)
        with torch.no_grad():
            return token_logprobs(self.policy.logits(batch, self.reference), batch.token_ids)

    def update(self, samples: list[TrajectorySample], advantages: list[float]) -> dict[str, float]:
        kw = self.kw
        pol = self.policy
        pol.model.train()
        stats = defaultdict(float)
        n_tokens = float(sum(sum(s.loss_mask[1:]) for s in samples)) or 1.0
        order = list(range(len(samples)))
        e_div = float(kw.epochs_per_step)  # the max is divided by the epoch count below like the sums
        for _ in range(kw.epochs_per_step):
            random.shuffle(order)
            self.optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(order), kw.micro_batch_size):
                idx = order[start:start + kw.micro_batch_size]
                batch = collate([samples[i] for i in idx], pol.pad_id).to(pol.device)
                adv = torch.tensor([advantages[i] for i in idx], dtype=torch.float32, device=pol.device)
                logp = token_logprobs(pol.logits(batch), batch.token_ids)
                ref = self.reference_logprobs(batch)
                out = grpo_loss(logp, batch.old_logprobs, adv, batch.loss_mask, kw.clip_range, kw.clip_range_high,
                                ref, kw.kl_coef, normalizer=n_tokens, tis_cap=getattr(kw, "tis_cap", None))
                out.loss.backward()
                w = float(batch.loss_mask.sum()) / n_tokens
                stats["policy_loss"] += out.policy_loss
                stats["kl"] += out.kl
                stats["clip_fraction"] += out.clip_fraction * w
                stats["ratio_mean"] += out.ratio_mean * w
                stats["logprob_gap_mean"] += out.logprob_gap_mean * w
                stats["logprob_gap_max"] = max(stats["logprob_gap_max"], out.logprob_gap_max * e_div)
                stats["tis_weight_mean"] += out.tis_weight_mean * w
            grad_norm = torch.nn.utils.clip_grad_norm_(pol.parameters(), kw.max_grad_norm)
            self.optimizer.step()
            stats["grad_norm"] = float(grad_norm)
        e = float(kw.epochs_per_step)
        return {k: (v / e if k != "grad_norm" else v) for k, v in stats.items()} | {"trained_tokens": n_tokens}


def sft_train(policy: LLMPolicy, samples: list[TrajectorySample], kwargs: Any, seed: int = 0,
              on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Behaviour cloning: masked cross-entropy over the demonstrations' target tokens. Returns losses."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=kwargs.learning_rate, weight_decay=0.0)
    policy.model.train()
    losses: list[float] = []
    step = 0
    for _ in range(kwargs.epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        for start in range(0, len(order), kwargs.batch_size):
            batch = collate([samples[i] for i in order[start:start + kwargs.batch_size]], policy.pad_id).to(policy.device)
            loss = sft_loss(policy.logits(batch), batch.token_ids, batch.loss_mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), kwargs.max_grad_norm)
            opt.step()
            losses.append(loss.item())
            step += 1
            if on_step is not None:
                on_step(step, losses[-1])
            if kwargs.max_steps and step >= kwargs.max_steps:
                return losses
    return losses


def success_rate(groups: Groups) -> dict[str, float]:
    """Mean reward over sessions that produced a verdict; ERROR sessions count as failures."""
    results = [r for g in groups for r in g]
    rewards = [r.reward if r.status == SessionStatus.DONE and r.reward is not None else 0.0 for r in results]
    return {"success": sum(rewards) / max(1, len(rewards)), "sessions": len(results),
            "errors": sum(r.status == SessionStatus.ERROR for r in results)}


class GRPOTrainer:
    """Owns the loop; ``stack`` is a started :class:`polar.rollout.sessions.local.LocalStack` (or anything with
    ``run_groups`` / ``update_weights`` / ``engine``)."""

    def __init__(self, stack: Any, policy: LLMPolicy, kwargs: Any, tasks: list[dict[str, Any]],
                 eval_tasks: list[dict[str, Any]] | None = None, logger: Any = None, checkpoints: Any = None,
                 checkpoint_freq: int = 0, seed: int = 0, version: int | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.stack, self.policy, self.kw = stack, policy, kwargs
        self.tasks, self.eval_tasks = list(tasks), list(eval_tasks or [])
        self.learner = GRPOLearner(policy, kwargs)
        self.logger, self.checkpoints, self.checkpoint_freq = logger, checkpoints, checkpoint_freq
        self.rng = random.Random(seed)
        self.version = int(stack.engine.policy_version if version is None else version)
        self.step = 0
        self.on_step = on_step
        self._order: list[int] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="polar-collect")

    def _next_tasks(self) -> list[dict[str, Any]]:
        out = []
        for _ in range(self.kw.tasks_per_step):
            if not self._order:
                self._order = list(range(len(self.tasks)))
                self.rng.shuffle(self._order)
            out.append(self.tasks[self._order.pop()])
        return out

    def _submit(self) -> concurrent.futures.Future:
        groups = [(t, self.kw.group_size, {"rollout_step": self.step}) for t in self._next_tasks()]
        return self._pool.submit(self.stack.run_groups, groups)

    def evaluate(self, samples_per_task: int = 1) -> dict[str, float]:
        if not self.eval_tasks:
            return {}
        groups = self.stack.run_groups([(t, samples_per_task, {"eval": True}) for t in self.eval_tasks])
        return success_rate(groups)

    def sync_weights(self) -> None:
        self.version += 1
        self.stack.update_weights(self.policy.serving_state_dict(), self.version)

    def state(self) -> dict[str, Any]:
        return {"model": self.policy.state_dict(), "optimizer": self.learner.optimizer.state_dict(),
                "step": self.step, "policy_version": self.version}

    def load_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["model"])
        self.learner.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.version = int(state["policy_version"]) - 1
        self.sync_weights()

    def train(self) -> dict[str, Any]:
        kw = self.kw
        t0 = time.monotonic()
        pending = self._submit()
        history = []
        # stop_requested: Ctrl-C / SIGTERM while the caller defers them (train_agentic): this step ends first
        while self.step < kw.total_steps and not stop_requested():
            t_collect = time.monotonic()
            groups = pending.result()
            wait_s = time.monotonic() - t_collect
            if kw.max_off_policy_steps >= 1 and self.step + 1 < kw.total_steps:
                pending = self._submit()  # collect the next batch while this one trains
            samples, advs, counts = group_batch(groups, self.version, kw.max_off_policy_steps, kw.advantage)
            t_learn = time.monotonic()
            upd = self.learner.update(samples, advs) if samples else {}
            if samples:  # a step with no usable group changed no weight: no swap, no new version
                self.sync_weights()
            else:
                log.info("GRPO step %d: no usable group (%s); the weights and policy version stay",
                         self.step + 1, ", ".join(f"{k} {int(v)}" for k, v in counts.items() if k.startswith("groups_")))
            self.step += 1
            rewards = [r.reward for g in groups for r in g if r.reward is not None]
            row = {"step": self.step, "policy_version": self.version, "reward_mean": sum(rewards) / max(1, len(rewards)),
                   "samples": len(samples), "update_skipped": int(not samples), "collect_wait_s": round(wait_s, 3),
                   "learn_s": round(time.monotonic() - t_learn, 3), "time_s": round(time.monotonic() - t0, 3),
                   **counts, **upd}
            if kw.eval_every and self.step % kw.eval_every == 0 and self.step < kw.total_steps:
                row.update({f"eval_{k}": v for k, v in self.evaluate(kw.eval_samples).items()})
            history.append(row)
            if self.logger is not None:
                self.logger.log(row, self.step)
            if self.on_step is not None:
                self.on_step(row)
            if self.checkpoints is not None and self.checkpoint_freq and self.step % self.checkpoint_freq == 0:
                self.checkpoints.save(self.step, self.state())
            if self.step >= kw.total_steps and kw.max_off_policy_steps >= 1 and pending is not None and not pending.done():
                pending.cancel()
            if self.step < kw.total_steps and kw.max_off_policy_steps == 0:
                pending = self._submit()
        if stop_requested() and pending is not None:
            pending.cancel()  # a batch not yet started; one under way finishes (SIGTERM's grace period bounds it)
        self._pool.shutdown(wait=True)
        if self.checkpoints is not None:
            self.checkpoints.save(self.step, self.state())
        if (signame := stop_requested()) is not None:
            ckpt = self.checkpoints.latest() if self.checkpoints is not None else None
            raise stopped_after_checkpoint(signame, self.checkpoints.dir.parent if ckpt else None, ckpt,
                                           f"GRPO step {self.step}")
        return {"steps": self.step, "time_s": time.monotonic() - t0, "history": history}
