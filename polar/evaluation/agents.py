"""Agent-harness evaluation: held-out tasks through the session pipeline with a model, a checkpoint's
weights, or an ensemble of checkpoints, and per-session records for the metrics.

``deterministic`` (the default) decodes greedily (:class:`GreedyEngine`), so the same tasks and weights give
the same sessions. An ensemble (:class:`EnsembleEngine`) samples each token from the mean of its members'
next-token distributions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import random
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import torch

from polar.config.run import AgentRunConfig
from polar.errors import ConfigError
from polar.inference.base import Engine, EngineError, GenerationRequest, TokenEvent

log = logging.getLogger(__name__)


class _Proxy:
    """Serves as the engine it wraps (tokenizer, model_name, policy_version, health, ...)."""

    def __init__(self, inner: Any) -> None:
        self.__dict__["inner"] = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class GreedyEngine(_Proxy):
    """Every request decoded at temperature 0, whatever the harness asks for: reproducible evaluation."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        async for ev in self.inner.generate(dataclasses.replace(request, temperature=0.0)):
            yield ev


class EnsembleEngine(_Proxy):
    """Samples each token from the mean of the members' next-token probabilities (members: embedded engines
    over the same tokenizer, each holding one checkpoint's weights). Requests run one at a time; top_p is
    ignored; the reported logprob is that of the mean distribution."""

    def __init__(self, members: list[Any]) -> None:
        super().__init__(members[0])
        found = [getattr(m, "model", None) for m in members]
        models = [m for m in found if m is not None]
        if len(models) != len(found):
            raise ConfigError("an agent ensemble needs embedded engines (model: tiny or a local folder)")
        self.__dict__.update(members=members, models=models, lock=threading.Lock())
        params = inspect.signature(models[0].forward).parameters
        self.__dict__["cache_kw"] = "cache" if "cache" in params else "past_key_values"

    @property
    def policy_version(self) -> int:
        return 0

    async def update_weights(self, state_dict: Any, version: int) -> None:
        raise EngineError("an ensemble engine serves fixed checkpoints; it cannot update weights")

    @torch.no_grad()
    def _next_probs(self, ids: torch.Tensor, caches: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        probs, out_caches = [], []
        for model, cache in zip(self.models, caches, strict=True):
            out = model(input_ids=ids, use_cache=True, **{self.cache_kw: cache})
            probs.append(torch.softmax(out.logits[0, -1].float(), -1))
            out_caches.append(out.past_key_values)
        return torch.stack(probs).mean(0), out_caches

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        max_tokens = self.inner.check_prompt(request)
        gen = torch.Generator()
        gen.manual_seed(request.seed if request.seed is not None else random.getrandbits(63))
        stops = {int(t) for t in request.stop_token_ids}
        device = next(self.models[0].parameters()).device
        ids = torch.tensor([request.prompt_ids], device=device)
        caches: list[Any] = [None] * len(self.models)

        def step(x: torch.Tensor, c: list[Any]) -> tuple[torch.Tensor, list[Any]]:
            with self.lock:
                return self._next_probs(x, c)

        for n in range(max_tokens):
            probs, caches = await asyncio.to_thread(step, ids, caches)
            if request.temperature == 0:
                tok = int(probs.argmax())
            else:
                p = probs.clamp_min(1e-30).log() / request.temperature
                tok = int(torch.multinomial(torch.softmax(p, -1).cpu(), 1, generator=gen))
            logprob = float(torch.log(probs[tok].clamp_min(1e-30)))
            finish: Literal["stop", "length"] | None = (
                "stop" if tok in stops else ("length" if n == max_tokens - 1 else None))
            yield TokenEvent(tok, logprob, finish, 0 if finish else None)
            if finish:
                return
            ids = torch.tensor([[tok]], device=device)


def _embedded_engine(spec: str, cfg: AgentRunConfig) -> Engine:
    from polar.harness.agent.tasks import resolve
    from polar.inference import load_engine

    launched = cfg.model if cfg.model is not None else cfg.gateway
    if launched.engine != "embedded":
        raise ConfigError(f"evaluation suites run agent harnesses on the embedded engine; {spec!r} is set to "
                          f"engine: {launched.engine}")
    chat_template = (cfg.model.chat_template if cfg.model else None) or cfg.gateway.chat_template
    if chat_template and chat_template.removeprefix("builtin:") not in ("model", "hermes-tools"):
        chat_template = str(resolve(chat_template, cfg.config_dir))
    return load_engine(spec, **({"seed": cfg.seed} if spec == "tiny" else {}), **cfg.gateway.engine_kwargs,
                       chat_template=chat_template)


def _load_weights(engine: Any, cfg: AgentRunConfig, checkpoint: Path) -> int:
    """Put a checkpoint's LLM weights into ``engine``; returns its policy version."""
    from polar.errors import RunDirError
    from polar.models.llm_policy import LLMPolicy
    from polar.trainers.agentic_run import policy_options
    from polar.trainers.checkpoint import load_checkpoint

    state = load_checkpoint(checkpoint)
    if "model" not in state:
        raise RunDirError(f"checkpoint {checkpoint} holds no LLM weights ('model'); it was not written by an agent run")
    policy = LLMPolicy.from_engine(engine, getattr(cfg.policy.kwargs, "lora", None), **policy_options(cfg))
    policy.load_state_dict(state["model"])
    version = int(state.get("policy_version", 0))
    asyncio.run(engine.update_weights(policy.serving_state_dict(), version))
    return version


def session_records(results: list[tuple[str, Any]], records_dir: Path) -> list[dict[str, Any]]:
    """One metrics record per session: status, reward, calls, prompt and sampled tokens (from the gateway's
    call records), time to completion."""
    from polar.gateway.sessions import SessionStore

    store = SessionStore(records_dir, resume=True)
    out = []
    try:
        for task_id, r in results:
            calls = store.records(r.session_id) if store.has_records(r.session_id) else []
            out.append({
                "task_id": task_id, "sample": r.sample_index, "session_id": r.session_id,
                "status": getattr(r.status, "value", str(r.status)).lower(), "reward": r.reward,
                "error": r.error, "num_calls": int(r.num_calls),
                # the verifier's own verdict (an LLM env agent's "reached the goal"), None when it gives none
                "success": r.verifier_output.get("success") if isinstance(r.verifier_output.get("success"), bool)
                else None,
                "prompt_tokens": sum(len(c.prompt_ids) for c in calls),
                "completion_tokens": sum(len(c.sampled_ids) for c in calls),
                "time_to_completion_s": float(r.timings.get("total_s", 0.0)),
            })
    finally:
        store.close()
    return out


def run_agent_sessions(cfg: AgentRunConfig, engine: Any, tasks: list[dict[str, Any]], samples: int, work_dir: Path,
                       records_dir: Path, tag: str) -> list[dict[str, Any]]:
    """``samples`` sessions of every task through a fresh stack over ``engine``; records in task order."""
    from polar.trainers.agentic_run import build_stack

    t0 = time.monotonic()
    with build_stack(cfg, work_dir, engine, records_dir=records_dir) as stack:
        groups = stack.run_groups([(t, samples, {"eval": tag}) for t in tasks])
    results = [(str(t.get("id", i)), r) for i, (t, g) in enumerate(zip(tasks, groups, strict=True))
               for r in sorted(g, key=lambda r: r.sample_index)]
    recs = session_records(results, records_dir)
    log.info("%s: %d sessions in %.1fs", tag, len(recs), time.monotonic() - t0)
    return recs
