"""An action cache: a rendered prompt's greedy completion, replayed instead of generated again.

A deterministic harness (a fixed FrozenLake map, a fixed task set) asks the same policy the same prompt
many times; at temperature 0 the answer is a function of (weights, prompt ids, max_tokens, stop ids), so
the second ask can replay the first answer's tokens. The key is exactly that: the engine's
``policy_version``, the prompt's token ids (compared in full, never by a hash alone, so one prompt's
answer never serves another), ``max_tokens``, the stop ids and ``top_logprobs``. A replayed answer carries
the token ids, logprobs and top logprobs the engine reported the first time, bit for bit, and the
``policy_version`` it was sampled under: a record of a hit is the record of the miss it replays.

Why greedy only: at temperature > 0 the answer is a sample, and replaying one sample for every ask would
silently turn a stochastic policy into a deterministic one (and a GRPO group into copies). A request
with temperature > 0 is refused (:class:`ActionCacheRefused`), never passed through uncached, so a
misconfigured evaluation fails loudly instead of measuring something else.

Why off in training: the weights change every step, so every sync empties the cache, and training samples
at temperature > 0 anyway. The gateway builds it for serving (``gateway.action_cache`` in
``polar gateway --config``) and ``polar eval --action-cache``; an agent run's config refuses it.

Bounded: least recently used entries go first once ``max_entries`` or ``max_bytes`` (prompt ids at 4 bytes
a token, sampled tokens at 16 bytes, top logprobs at 16 bytes per alternative) is passed. Invalidated: a
request under a new ``policy_version`` (a weight sync, however it arrived) empties the cache first.
Coalesced: a request identical to one being answered right now waits for that answer instead of computing
it again (an evaluation starts its episodes together, all at the same first prompt).
"""

from __future__ import annotations

import array
import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from polar.inference.base import EngineError, GenerationRequest, TokenEvent

ENTRY_OVERHEAD_BYTES = 256  # dict slot, key tuple, entry object: a floor so tiny entries still count


class ActionCacheRefused(EngineError):
    """A request the cache cannot answer correctly (temperature > 0); ``param`` is the request field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class _Entry:
    events: tuple[TokenEvent, ...]
    nbytes: int


class ActionCache:
    """The LRU store and its counters; one per engine (an engine is one policy)."""

    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise EngineError(f"gateway.action_cache needs max_entries >= 1 and max_bytes >= 1 (got {max_entries}, "
                              f"{max_bytes})")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self.version: int | None = None
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.invalidations = 0
        self.waits = 0  # hits answered by waiting for an identical request in flight

    def _at(self, version: int) -> None:
        """Empty the cache when the policy moved on: nothing of an older version is ever replayed."""
        if self.version != version:
            if self._entries:
                self.invalidations += 1
            self._entries.clear()
            self.nbytes = 0
            self.version = version

    def get(self, version: int, key: tuple[Any, ...]) -> tuple[TokenEvent, ...] | None:
        self._at(version)
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry.events

    def put(self, version: int, key: tuple[Any, ...], events: list[TokenEvent]) -> None:
        self._at(version)
        alternatives = sum(len(ev.top_logprobs or ()) for ev in events)
        nbytes = ENTRY_OVERHEAD_BYTES + len(key[0]) + 16 * len(events) + 16 * alternatives
        if nbytes > self.max_bytes:
            return  # one answer larger than the whole cache: not kept
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[key] = _Entry(tuple(events), nbytes)
        self.nbytes += nbytes
        while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
            _, gone = self._entries.popitem(last=False)
            self.nbytes -= gone.nbytes
            self.evictions += 1

    def coalesced(self) -> None:
        """A lookup that missed, then got its answer from an identical request in flight: a hit after all."""
        self.misses -= 1
        self.hits += 1
        self.waits += 1

    def clear(self) -> None:
        if self._entries:
            self.invalidations += 1
        self._entries.clear()
        self.nbytes = 0

    def stats(self) -> dict[str, Any]:
        """The cache's metrics: ``hit_rate`` is hits over lookups (None before the first)."""
        lookups = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hits / lookups if lookups else None,
                "entries": len(self._entries), "bytes": self.nbytes, "max_entries": self.max_entries,
                "max_bytes": self.max_bytes, "evictions": self.evictions, "invalidations": self.invalidations, "waits": self.waits,
                "policy_version": self.version}


def _copy(ev: TokenEvent) -> TokenEvent:
    return TokenEvent(ev.token_id, ev.logprob, ev.finish_reason, ev.policy_version,
                      list(ev.top_logprobs) if ev.top_logprobs is not None else None)


def request_key(request: GenerationRequest) -> tuple[Any, ...]:
    """Everything that decides a greedy answer besides the weights: the full prompt ids (as packed bytes,
    compared exactly), ``max_tokens``, the stop ids and how many alternatives are reported. Seed and top-p
    do not change a greedy answer."""
    ids = array.array("I", request.prompt_ids).tobytes()
    return (ids, int(request.max_tokens), tuple(int(t) for t in request.stop_token_ids), int(request.top_logprobs))


class ActionCacheEngine:
    """Serves as the engine it wraps (tokenizer, model_name, policy_version, ...), answering greedy requests
    it has seen at the current policy version from :class:`ActionCache`.

    Only complete answers are kept (finish ``stop`` or ``length`` under the version the request started
    at); an aborted stream, or one the caller closed early (a stop string), is not.
    """

    _own = frozenset({"inner", "cache", "pending"})
    inner: Any
    cache: ActionCache
    pending: dict[tuple[int, tuple[Any, ...]], asyncio.Future[tuple[TokenEvent, ...] | None]]

    def __init__(self, inner: Any, cache: ActionCache) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "cache", cache)
        # answers being generated now, by (version, key): an identical request waits for the first one's
        object.__setattr__(self, "pending", {})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # e.g. a gateway node stamping policy_version: the engine's own attribute, never a shadow copy here
        if name in self._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if request.temperature != 0:
            raise ActionCacheRefused(
                f"temperature is {request.temperature:g}, but the action cache (gateway.action_cache) replays "
                "greedy answers only; send temperature 0, or turn the action cache off", "temperature")
        version = int(getattr(self.inner, "policy_version", 0) or 0)
        key = request_key(request)
        cached = self.cache.get(version, key)
        if cached is None and (version, key) in self.pending:
            # the same prompt is being answered right now (an evaluation starts its episodes together): wait
            # for that answer rather than compute it twice; a failed or cut-short one leaves us to generate
            cached = await asyncio.shield(self.pending[(version, key)])
            if cached is not None:
                self.cache.coalesced()
        if cached is not None:
            for ev in cached:
                yield _copy(ev)
            return
        done: asyncio.Future[tuple[TokenEvent, ...] | None] = asyncio.get_running_loop().create_future()
        self.pending[(version, key)] = done
        seen: list[TokenEvent] = []
        try:
            async for ev in self.inner.generate(request):
                seen.append(_copy(ev))
                # kept before the last event goes out: the gateway closes the stream once it has it
                if ev.finish_reason in ("stop", "length") and (ev.policy_version is None or ev.policy_version == version):
                    self.cache.put(version, key, seen)
                    done.set_result(tuple(seen))
                yield ev
        finally:
            if not done.done():
                done.set_result(None)
            if self.pending.get((version, key)) is done:
                del self.pending[(version, key)]

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Swap the inner engine's weights; the cache empties (also when the swap fails half-way)."""
        self.cache.clear()
        await self.inner.update_weights(state_dict, version)

    def stats(self) -> dict[str, Any]:
        return self.cache.stats()


def with_action_cache(engine: Any, max_entries: int, max_bytes: int) -> ActionCacheEngine:
    """``engine`` behind a fresh :class:`ActionCache`; refuses a text-level engine (``engine: openai_compat``),
    whose calls never pass through token generation, so nothing could be cached."""
    if bool(getattr(engine, "text_level", False)):
        raise EngineError("gateway.action_cache caches token-level engines (embedded, vllm); engine: openai_compat "
                          "answers chat messages through its endpoint, so its calls cannot be cached; turn the "
                          "action cache off")
    if isinstance(engine, ActionCacheEngine):
        engine = engine.inner
    return ActionCacheEngine(engine, ActionCache(max_entries, max_bytes))
