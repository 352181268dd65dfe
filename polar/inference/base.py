"""The one interface every inference engine implements: token ids in, a stream of sampled tokens out.

The gateway owns tokenization and chat templates; engines only ever see token ids. That is what keeps
captured trajectories token-faithful: the ids an engine reports are exactly the ids it consumed and
sampled, whether it runs in-process (``EmbeddedEngine``) or behind HTTP (``UpstreamEngine``).

Contract of :meth:`Engine.generate` (an async generator):

- yields one :class:`TokenEvent` per sampled token, as soon as it is sampled (real streaming);
- the last event carries ``finish_reason``: ``"stop"`` (a stop token was sampled; that token *is*
  included as the last event, so trajectories learn to stop), ``"length"`` (``max_tokens`` reached, or
  the context window is full), or ``"abort"`` (the engine was closed, weights were swapped mid-stream,
  or an upstream failed mid-stream);
- the final event may carry no token (``token_id is None``): always for ``"abort"``, and when an
  upstream sends its finish reason in a chunk of its own; consumers must skip such ids;
- ``logprob`` is the log-probability of the sampled token under the **raw model distribution**
  (log-softmax of the logits at temperature 1, before top-p), the same quantity a trainer recomputes
  with a plain forward pass and vLLM/SGLang return by default. Sampling itself uses temperature/top-p;
  importance ratios for off-policy correction should be computed against these raw logprobs.
- a prompt that leaves no room in the context window raises :class:`ContextLengthExceeded` before the
  first event; ``max_tokens`` is otherwise clamped to the room left (finishing with ``"length"``).
- closing the generator early (``aclose()``, or cancelling the consuming task) cancels the request.
"""

from __future__ import annotations

import abc
import os
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from polar.errors import GatewayError

if TYPE_CHECKING:  # transformers is heavy; only engines import it at run time
    from transformers import PreTrainedTokenizerBase

FinishReason = Literal["stop", "length", "abort"]


class EngineError(GatewayError):
    """An inference engine (embedded or upstream) failed to serve a request."""


class ContextLengthExceeded(EngineError):
    """The prompt alone fills the engine's context window; carries both numbers for provider errors."""

    def __init__(self, prompt_tokens: int, context_length: int, *, at_least: bool = False) -> None:
        super().__init__(
            f"prompt is {'at least ' if at_least else ''}{prompt_tokens} tokens but the model's context window "
            f"is {context_length} tokens; shorten the conversation or use a model with a longer context"
        )
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        self.at_least = at_least  # the prompt was refused before it was fully tokenized


class UpstreamUnavailable(EngineError):
    """No upstream replica answered (all failed or timed out)."""


def _ids_within(ids: list[int], vocab_size: int) -> bool:
    """The fast check (C-level min/max); anything that cannot be compared goes to the slow, precise one."""
    try:
        return min(ids) >= 0 and max(ids) < vocab_size
    except TypeError:
        return False


_IDS = random.Random()  # seeded from the OS once: request ids need to be unique, not secret
os.register_at_fork(after_in_child=_IDS.seed)  # a forked process must not repeat its parent's ids


def _request_id() -> str:
    """32 hex digits, like ``uuid4().hex``, without the system call per id that ``uuid4`` makes."""
    return f"{_IDS.getrandbits(128):032x}"


@dataclass
class GenerationRequest:
    """One generation call, in token ids. ``session_id`` lets upstream engines route stickily."""

    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    session_id: str | None = None
    request_id: str = field(default_factory=_request_id)
    # hint: False when nobody watches tokens arrive, so upstream engines may fetch the whole result in one
    # non-streamed request (far less per-token overhead); engines may ignore it
    stream: bool = True
    # how many most likely alternatives (raw-model logprobs) to report with each sampled token; engines
    # support up to their ``max_top_logprobs``
    top_logprobs: int = 0
    # (len(prompt_ids), vocab_size) of the last successful id check: a million ids take tens of ms to check
    _checked: tuple[int, int | None] | None = field(default=None, repr=False, compare=False)

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ``EngineError`` naming the bad field; engines call this before queueing."""
        if not self.prompt_ids:
            raise EngineError("GenerationRequest.prompt_ids is empty; render at least one token")
        # the ids are checked once: the gateway checks them off its event loop, the engine again on it
        if self._checked != (len(self.prompt_ids), vocab_size):
            if vocab_size is not None and not _ids_within(self.prompt_ids, vocab_size):
                bad = [t for t in self.prompt_ids if not (isinstance(t, int) and 0 <= t < vocab_size)]
                if bad:
                    raise EngineError(
                        f"GenerationRequest.prompt_ids has ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
                    )
            self._checked = (len(self.prompt_ids), vocab_size)
        for name in ("max_tokens", "temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise EngineError(f"GenerationRequest.{name} must be a number (got {value!r})")
        if self.max_tokens < 1:
            raise EngineError(f"GenerationRequest.max_tokens must be >= 1 (got {self.max_tokens})")
        if self.temperature < 0:
            raise EngineError(f"GenerationRequest.temperature must be >= 0 (got {self.temperature})")
        if not (0 < self.top_p <= 1):
            raise EngineError(f"GenerationRequest.top_p must be in (0, 1] (got {self.top_p})")


@dataclass
class TokenEvent:
    """One sampled token. ``finish_reason`` is set only on the last event.

    ``policy_version`` is the version of the weights that sampled this token. Engines that abort in-flight
    streams when weights change set it on the last event only (it is then every token's); an engine that
    continues a stream across a weight update (``Engine.continues_in_flight``) sets it on every event, so a
    stream that spans an update says which of its tokens each version sampled (partial rollouts).
    """

    token_id: int | None
    logprob: float | None
    finish_reason: FinishReason | None = None
    policy_version: int | None = None
    # with ``GenerationRequest.top_logprobs``: the most likely ids at this position and their raw-model
    # logprobs, most likely first
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class GenerationResult:
    """A whole stream collected (see :func:`collect`)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int | None = None


class Engine(abc.ABC):
    """Base class of all engines. Subclasses set the attributes below in ``__init__``.

    Attributes:
        tokenizer: an HF fast tokenizer whose ``chat_template`` supports tools (Hermes ``<tool_call>``).
        model_name: the name this engine serves (for ``/v1/models``).
        context_length: max prompt + completion tokens.
        policy_version: bumped by ``update_weights``; the gateway stamps it on every record.
        default_stop_token_ids: end-of-turn ids (e.g. ``<|im_end|>``, eos) the gateway adds to every chat request.
        max_top_logprobs: how many top alternatives per token the engine can report (0: none).
    """

    tokenizer: PreTrainedTokenizerBase
    model_name: str
    context_length: int
    policy_version: int = 0
    default_stop_token_ids: list[int]
    # set by polar.inference.templates.choose_chat_template (load_engine, the gateway): which template
    # the tokenizer renders with ("model", "builtin:hermes-tools", "file:PATH") and whether it renders tools
    chat_template_source: str | None = None
    chat_template_tools: bool = True
    max_top_logprobs: int = 0  # the most GenerationRequest.top_logprobs this engine can report
    # update_weights_in_flight: generations under way go on under the new weights (partial rollouts)
    continues_in_flight: bool = False
    # what its logprobs are, recorded with every call: "raw_logprobs" is the model's own distribution at
    # temperature 1 before top-p (what the learner recomputes), as the embedded engine and vLLM's default give
    logprob_mode: str = "raw_logprobs"

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Stream sampled tokens for ``request`` (an async generator; see the module docstring)."""

    async def generate_whole(self, request: GenerationRequest) -> GenerationResult | None:
        """The whole answer at once, for a caller that shows nothing before the end (the gateway's
        non-streamed calls without stop strings or top logprobs); ``None``: take ``generate``'s events.

        An engine that receives a non-streamed answer in one piece anyway (an upstream's single JSON
        body) returns it here, sparing an event and a generator step per token. The result's
        ``policy_version`` is the one the last token carries (``None``: the version the call started
        under, as for a ``TokenEvent``), so the record is the same either way."""
        return None

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Swap in new weights and set ``policy_version = version``. Engines without local weights refuse."""
        raise EngineError(f"{type(self).__name__} cannot update weights in place")

    async def update_weights_in_flight(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Swap in new weights while generations are under way: each goes on under the new weights, its
        later tokens stamped ``version`` (``gateway.sync.in_flight: continue``). Only engines with
        ``continues_in_flight`` can; the others refuse."""
        raise EngineError(f"{type(self).__name__} cannot continue a generation across a weight update; "
                          "use gateway.sync.in_flight: finish or abort with it")

    async def abort_inflight(self) -> int:
        """End the generations under way (each finishes with ``"abort"``), for a weight sync with
        ``gateway.sync.in_flight: abort``; returns how many were ended (engines that cannot: 0)."""
        return 0

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources; in-flight streams end with ``finish_reason="abort"``."""

    async def health(self) -> dict[str, Any]:
        """Whether this engine can serve now: ``{"state": "ok" | "degraded" | "unavailable", ...}``.

        ``degraded`` still serves (some upstream replicas are down); ``unavailable`` cannot. Must return
        within a few seconds whatever the engine's state (``/health`` awaits it); engines that probe
        something remote cache the answer briefly."""
        return {"state": "ok"}

    @property
    def vocab_size(self) -> int:
        """``len(tokenizer)``, cached: transformers recomputes it on every call. Tokens are never added
        to a served tokenizer, so the first answer stays right."""
        size = self.__dict__.get("_vocab_size")
        if size is None or size <= 0:
            size = self.__dict__["_vocab_size"] = len(self.tokenizer)
        return size

    def check_prompt(self, request: GenerationRequest) -> int:
        """Validate ``request`` and return the clamped max_tokens (room left in the context window)."""
        request.validate(self.vocab_size)
        room = self.context_length - len(request.prompt_ids)
        if room < 1:
            raise ContextLengthExceeded(len(request.prompt_ids), self.context_length)
        return min(request.max_tokens, room)


async def collect(events: AsyncIterator[TokenEvent]) -> GenerationResult:
    """Drain a token stream into a :class:`GenerationResult`."""
    ids: list[int] = []
    lps: list[float] = []
    finish: FinishReason = "abort"
    version: int | None = None
    async for ev in events:
        if ev.token_id is not None:
            ids.append(int(ev.token_id))
            lps.append(float(ev.logprob if ev.logprob is not None else 0.0))
        if ev.finish_reason is not None:
            finish, version = ev.finish_reason, ev.policy_version
    return GenerationResult(ids, lps, finish, version)
