"""``UpstreamEngine``: the :class:`~polar.inference.base.Engine` over vLLM or SGLang replicas, composed of the
replica set (routing, failover, health: :mod:`.replicas`), the wire formats (:mod:`.wire`) and the weight sync
(:mod:`.sync`).

The gateway tokenizes, so the engine sends **token-id prompts** and reads back token ids and logprobs (never
text), straight from each replica rather than through a router that may strip them. A replica that fails
before streaming any token is marked down for ``cooldown_s`` and the request moves to the next replica; a
failure after tokens were streamed ends the stream with ``"abort"``.

A request with ``stream=False`` (the gateway sets it when its client did not ask for streaming) is sent as one
non-streamed upstream call whose single JSON body carries all ids and logprobs: no per-token SSE events to
frame and parse, which is most of this hop's cost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from polar.config.base import validate
from polar.config.sync import WeightSyncConfig
from polar.inference._http1 import HttpError
from polar.inference.base import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    TokenEvent,
    UpstreamUnavailable,
)
from polar.inference.lora import LoraAdapter
from polar.inference.upstream.config import UPSTREAM_KINDS, UpstreamConfig
from polar.inference.upstream.replicas import HealthProbe, Replica, ReplicaSet, probe_sync
from polar.inference.upstream.sync import UpstreamWeightSync
from polar.inference.upstream.tokenizer import load_tokenizer, model_folder, model_name_of, stop_token_ids
from polar.inference.upstream.wire import ReplicaFailed, Triple, WireCall, call_for, payload, sse_payloads

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


class UpstreamEngine(Engine):
    """Streams generations from vLLM or SGLang replicas. Build with :func:`polar.inference.load_engine`.

    ``model_folder`` (default: the tokenizer's folder), ``served_folder`` (what the servers loaded, if another
    copy) and ``weights_dtype`` are what weight sync needs; a launcher passes its own."""

    def __init__(self, config: UpstreamConfig, tokenizer: PreTrainedTokenizerBase | None = None, *,
                 model_folder_path: Path | None = None, served_folder: Path | None = None,
                 weights_dtype: str = "float32") -> None:
        self.config = config
        self.kind = config.kind
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer)
        self.served_model = config.served_model
        self.model_name = config.model_name or config.served_model or model_name_of(config.tokenizer)
        max_len = getattr(self.tokenizer, "model_max_length", None)
        default_len = max_len if isinstance(max_len, int) and 0 < max_len < 10**7 else 32768
        self.context_length = int(config.context_length or default_len)
        self.policy_version = 0
        self.default_stop_token_ids = stop_token_ids(self.tokenizer)
        self.router = ReplicaSet(config.urls)
        self.replicas = self.router.replicas
        self._probe = HealthProbe(self.router, config)
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        # recorded with every call: vLLM's default --logprobs-mode is raw_logprobs (the model's, before any
        # temperature or top-p); SGLang's depends on its version and SGLANG_RETURN_ORIGINAL_LOGPROB
        self.logprob_mode = "raw_logprobs" if self.kind == "vllm" else "sglang (version-dependent)"
        self.model_folder = model_folder_path or model_folder(config.tokenizer)
        self.weight_sync = UpstreamWeightSync(
            self.kind, self.tokenizer, config.tokenizer, self.model_folder,
            targets=lambda: [r.url for r in self.router.admitted()], auth=config.auth_headers(),
            call_for=self._call_for, served_folder=served_folder, weights_dtype=weights_dtype)

    @classmethod
    def from_config(cls, spec: Mapping[str, Any] | UpstreamConfig,
                    tokenizer: PreTrainedTokenizerBase | None = None) -> UpstreamEngine:
        config = (
            spec if isinstance(spec, UpstreamConfig) else validate(UpstreamConfig, dict(spec), "upstream")
        )
        return cls(config, tokenizer)

    @classmethod
    def from_string(cls, spec: str, *, tokenizer: str = "tiny") -> UpstreamEngine:
        """``"vllm:http://h1:8000,http://h2:8000"`` or ``"sglang:http://h:30000"``."""
        kind, _, rest = spec.partition(":")
        urls = [u.strip() for u in rest.split(",") if u.strip()]
        if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
            raise EngineError(
                f"upstream spec '{spec}' needs one or more http(s) URLs after '{kind}:', "
                f"e.g. '{kind}:http://127.0.0.1:8000,http://127.0.0.1:8001'"
            )
        if kind not in UPSTREAM_KINDS:
            raise EngineError(f"upstream spec '{spec}' names kind {kind!r}; use one of {', '.join(UPSTREAM_KINDS)}")
        return cls(validate(UpstreamConfig, {"kind": kind, "urls": urls, "tokenizer": tokenizer}, "upstream"))

    # ------------------------------------------------------------------ the weight sync's state, read by callers
    @property
    def sync_config(self) -> WeightSyncConfig:
        return self.weight_sync.config

    @property
    def sync_hooks(self) -> list[Any]:
        """Called with each written sync folder before the push (tests corrupt it "in transit")."""
        return self.weight_sync.hooks

    @property
    def last_sync(self) -> dict[str, Any]:
        return self.weight_sync.last

    @property
    def served_folder(self) -> Path | None:
        return self.weight_sync.served_folder

    # ------------------------------------------------------------------ start
    def check_reachable(self, config_key: str = "model") -> None:
        """At start: every replica's ``GET /health`` (and, for vLLM, ``GET /v1/models``, which also
        resolves the served model). None answering is an error naming ``config_key``: a wrong URL
        fails now, in one line, not as every later call's 503. Some answering only warns (degraded)."""
        problems: list[str] = []
        timeout = httpx.Timeout(self.config.connect_timeout_s)
        with httpx.Client(timeout=timeout, headers=self.config.auth_headers()) as client:
            for replica in self.replicas:
                problem = probe_sync(client, replica.url, self.kind)
                if problem is None and self.kind == "vllm" and not self.served_model:
                    problem = self._served_model_sync(client, replica.url)
                if problem is not None:
                    problems.append(f"{replica.url} {problem}")
        if len(problems) == len(self.replicas):
            raise UpstreamUnavailable(
                f"{config_key}: no {self.kind} server is reachable: {'; '.join(problems)}; check the URL(s) "
                "or start the server(s) first"
            )
        for problem in problems:
            log.warning("%s: %s replica %s; serving with the others (degraded)", config_key, self.kind, problem)

    def _served_model_sync(self, client: httpx.Client, url: str) -> str | None:
        try:
            resp = client.get(f"{url}/v1/models")
        except httpx.HTTPError as exc:
            return f"did not answer GET /v1/models ({type(exc).__name__})"
        try:
            self.served_model = str(resp.json()["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            return f"answered GET /v1/models with HTTP {resp.status_code} and no model list: not a vLLM server?"
        return None

    async def resolve_served_model(self) -> str:
        """vLLM needs the served model id; ask the first healthy replica's ``GET /v1/models`` once."""
        if self.served_model:
            return self.served_model
        for replica in self.route(None):
            try:
                resp = await self._http().get(f"{replica.url}/v1/models")
                resp.raise_for_status()
                self.served_model = str(resp.json()["data"][0]["id"])
                return self.served_model
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                log.warning("could not list models at %s: %s", replica.url, exc)
        raise UpstreamUnavailable("no vLLM replica answered GET /v1/models; set served_model in the config")

    # ------------------------------------------------------------------ routing
    def route(self, session_id: str | None) -> list[Replica]:
        """Replicas in the order to try (see :meth:`ReplicaSet.route`)."""
        return self.router.route(session_id)

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            timeout = httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s)
            headers = {**self.config.auth_headers(), "Content-Type": "application/json"}
            # keep a warm connection per concurrent call (httpx's default keeps 20), one client for all replicas
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=60.0)
            self._client = httpx.AsyncClient(timeout=timeout, headers=headers, limits=limits)
            self._client_loop = loop
            self.router.new_pools(self.config.auth_headers())
        return self._client

    # ------------------------------------------------------------------ Engine API
    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if not request.stream:  # the whole answer in one response: it fails before any token goes out
            triples = await self._whole_routed(request)
            version = self.policy_version
            for t, lp, finish in triples:
                yield TokenEvent(t, lp, finish, version if finish else None)
            return
        max_tokens = self.check_prompt(request)
        errors: list[str] = []
        for replica in self.route(request.session_id):
            streamed = 0
            replica.in_flight += 1
            try:
                async for event in self._stream(replica, request, max_tokens):
                    streamed += 1
                    yield event
                return
            except ReplicaFailed as exc:
                replica.mark_down(self.config.cooldown_s)
                if streamed:  # tokens already went out: the call cannot move; end it as aborted
                    log.warning("upstream %s failed mid-stream: %s", replica.url, exc)
                    yield TokenEvent(None, None, "abort", self.policy_version)
                    return
                errors.append(f"{replica.url}: {exc}")
                log.warning("upstream %s failed, trying the next replica: %s", replica.url, exc)
            finally:
                replica.in_flight -= 1
        raise UpstreamUnavailable(f"no {self.kind} replica could serve the request: {'; '.join(errors)}")

    async def generate_whole(self, request: GenerationRequest) -> GenerationResult | None:
        """A non-streamed request's answer as it arrives, in one piece (no event per token)."""
        if request.stream:
            return None
        triples = await self._whole_routed(request)
        last_id, _, finish = triples[-1]
        tokens = triples if last_id is not None else triples[:-1]  # only a closing (None, None, finish) has no id
        return GenerationResult(list(map(itemgetter(0), tokens)), list(map(itemgetter(1), tokens)),
                                finish or "abort", self.policy_version if last_id is not None else None)

    async def _whole_routed(self, request: GenerationRequest) -> list[Triple]:
        """One non-streamed call, moved to the next replica when one fails (nothing was shown yet)."""
        max_tokens = self.check_prompt(request)
        errors: list[str] = []
        for replica in self.route(request.session_id):
            replica.in_flight += 1
            try:
                return await self._whole(replica, request, await self._call_for(request, max_tokens))
            except ReplicaFailed as exc:
                replica.mark_down(self.config.cooldown_s)
                errors.append(f"{replica.url}: {exc}")
                log.warning("upstream %s failed, trying the next replica: %s", replica.url, exc)
            finally:
                replica.in_flight -= 1
        raise UpstreamUnavailable(f"no {self.kind} replica could serve the request: {'; '.join(errors)}")

    async def health(self) -> dict[str, Any]:
        """Each replica's ``GET /health`` (see :class:`HealthProbe`: concurrent, bounded, cached briefly)."""
        return await self._probe.health(self._http())

    async def close(self) -> None:
        self.weight_sync.close()
        self.router.close()
        if self._client is not None:
            try:
                await self._client.aclose()
            except RuntimeError:  # created on an event loop that is gone
                pass
            self._client = None

    # ------------------------------------------------------------------ weight sync
    def configure_sync(self, config: WeightSyncConfig, default_dir: str | Path | None = None) -> None:
        """How :meth:`update_weights` pushes weights: the gateway calls this with ``gateway.sync`` and a
        folder next to its records (``sync.dir`` wins); without either, a temporary folder."""
        self.weight_sync.configure(config, default_dir)

    async def abort_inflight(self) -> int:
        """``sync.in_flight: abort``: end every request under way on every replica (they finish as ``abort``)."""
        return await self.weight_sync.abort_inflight()

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Push ``state_dict`` into every replica and stamp ``version`` on later records (see
        :mod:`polar.inference.upstream.sync`). On any failure (a push rejected, a replica unreachable, the
        logprob check off by more than ``sync.check_tolerance``) every replica is given the previous weights
        back, the version stays, and :class:`WeightSyncError` says what happened, with numbers.

        An empty ``state_dict`` only stamps ``version``: for weights synced through the server's own API."""
        if not state_dict:
            self.policy_version = int(version)
            return
        lock = self.weight_sync.lock
        await asyncio.to_thread(lock.acquire)
        try:
            if isinstance(state_dict, LoraAdapter):
                await self.weight_sync.sync_adapter(state_dict, int(version), self.policy_version)
            else:
                await self.weight_sync.sync(state_dict, int(version), self.policy_version)
            self.policy_version = int(version)
        finally:
            lock.release()

    def prepare_lora_sync(self, rank: int) -> bool:
        """Called at start by a LoRA learner (:class:`~polar.models.llm_policy.LLMPolicy`): True when its syncs
        are to send adapters only (``gateway.sync.lora: adapters``, the default), after checking that every
        replica can load them (else one line naming the key, at start rather than at the first sync)."""
        if self.weight_sync.config.lora != "adapters":
            return False
        self.weight_sync.check_lora_support(int(rank), self.weight_sync.lora_key)
        return True

    async def restore_replica(self, url: str) -> None:
        """A replica that came back (restarted) holds the base weights: give it the current ones, and check
        it, before it serves. Runs on the caller's thread (its own event loop); the caller holds the sync lock."""
        await self.weight_sync.restore(url, self.policy_version)

    # ------------------------------------------------------------------ one call to one replica
    async def _call_for(self, request: GenerationRequest, max_tokens: int, model: str | None = None) -> WireCall:
        """``model``: a vLLM model name to send (the weight sync's check names a new adapter); default: the
        current LoRA adapter of a LoRA run, else the served model."""
        if self.kind == "vllm":
            model = model or self.weight_sync.adapter or await self.resolve_served_model()
        return call_for(self.kind, request, max_tokens, model)

    async def _stream(self, replica: Replica, request: GenerationRequest, max_tokens: int
                      ) -> AsyncIterator[TokenEvent]:
        """A streamed call (``request.stream``); ``generate`` sends a non-streamed one with ``_whole``."""
        call = await self._call_for(request, max_tokens)
        try:
            async with self._http().stream("POST", f"{replica.url}{call.path}", content=call.body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    self._raise_for_status(replica, resp.status_code, text, request)
                payloads = sse_payloads(resp)
                async for chunk in payloads:
                    events = [
                        TokenEvent(t, lp, finish, self.policy_version if finish else None)
                        for t, lp, finish in call.parse(chunk)
                    ]
                    if events and events[-1].finish_reason is not None:
                        # read to the end ("[DONE]", sent right after) so the connection goes back to the
                        # pool instead of being closed half-read; then hand out the last events
                        async for _ in payloads:
                            pass
                        for ev in events:
                            yield ev
                        return
                    for ev in events:
                        yield ev
                raise ReplicaFailed("stream ended without a finish reason")
        except httpx.HTTPError as exc:
            raise ReplicaFailed(f"{type(exc).__name__}: {exc}") from exc

    async def _whole(self, replica: Replica, request: GenerationRequest, call: WireCall) -> list[Triple]:
        """One non-streamed call: the body holds every id and logprob (vLLM and SGLang alike)."""
        self._http()  # (re)builds the replica pools for this event loop
        assert replica.pool is not None
        cfg = self.config
        try:
            status, data = await replica.pool.post(call.path, call.body, cfg.timeout_s, cfg.connect_timeout_s)
        except HttpError as exc:
            raise ReplicaFailed(str(exc)) from exc
        if status != 200:
            self._raise_for_status(replica, status, data.decode("utf-8", "replace"), request)
        triples = call.parse(payload(data))
        if not triples or triples[-1][2] is None:
            raise ReplicaFailed("response has no finish reason")
        return triples

    def _raise_for_status(self, replica: Replica, status: int, text: str, request: GenerationRequest) -> None:
        if status >= 500 or status in (408, 429):
            raise ReplicaFailed(f"HTTP {status}: {text[:300]}")
        if "context length" in text.lower() or "context_length" in text.lower():
            raise ContextLengthExceeded(len(request.prompt_ids), self.context_length)
        raise EngineError(
            f"{self.kind} replica {replica.url} rejected the request (HTTP {status}): {text[:500]}"
        )
