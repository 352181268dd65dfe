"""The run's sampling settings on every model call of its training sessions (``policy.kwargs.temperature``,
``policy.kwargs.max_tokens``).

As in TRL and verl, the config says how the rollout samples, whatever the agent asks: the temperature
**replaces** the one in the request, and ``max_tokens`` **caps** the request's own (an agent that asks for
fewer tokens gets fewer; one that asks for none or more gets the config's). The gateway records the values
the engine used (``metadata.sampling``; the agent's own under ``sampling.requested``). The recorded
logprobs are the raw model's (temperature 1) at every temperature, as the learner's are
(``polar.inference.sampling``), so the importance ratio compares like with like.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from polar.inference.base import GenerationRequest, TokenEvent


class RolloutSampling:
    """Serves as the engine it wraps (tokenizer, model, policy_version, update_weights, ...), with the
    run's temperature and max-tokens cap applied to each request before the engine sees it."""

    _own = frozenset({"inner", "temperature", "max_tokens"})

    def __init__(self, inner: Any, temperature: float | None, max_tokens: int | None) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "max_tokens", max_tokens)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # e.g. a gateway node stamping policy_version: the engine's own attribute, never a shadow copy here
        if name in self._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def apply(self, request: GenerationRequest) -> GenerationRequest:
        """Set the run's sampling on ``request`` (in place: the gateway records the request it sent)."""
        if self.temperature is not None:
            request.temperature = self.temperature
        if self.max_tokens is not None and request.max_tokens > self.max_tokens:
            request.max_tokens = self.max_tokens
        return request

    def check_prompt(self, request: GenerationRequest) -> int:
        return int(self.inner.check_prompt(self.apply(request)))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        async for ev in self.inner.generate(self.apply(request)):
            yield ev


def with_rollout_sampling(engine: Any, temperature: float | None, max_tokens: int | None) -> Any:
    """``engine`` unchanged when there is nothing to apply, else wrapped (never twice)."""
    if temperature is None and max_tokens is None:
        return engine
    if isinstance(engine, RolloutSampling):
        engine = engine.inner
    return RolloutSampling(engine, temperature, max_tokens)
