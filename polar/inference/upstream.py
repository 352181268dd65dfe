"""Upstream engines: vLLM and SGLang servers, several replicas, session-sticky routing, failover.

The gateway tokenizes, so these engines send **token-id prompts** and read back token ids and logprobs
(never text), straight from each replica rather than through a router that may strip them:

- vLLM: ``POST /v1/completions`` with ``prompt`` as a list of ids, ``logprobs: 0`` (the sampled token's only), ``return_token_ids``
  and ``return_tokens_as_token_ids``; ids come from ``choices[0].token_ids`` (fallback: the
  ``token_id:N`` strings in ``logprobs.tokens``), logprobs from ``logprobs.token_logprobs``. vLLM
  returns raw-model logprobs by default (its ``--logprobs-mode raw_logprobs``).
- SGLang: ``POST /generate`` with ``input_ids``, ``sampling_params`` and ``return_logprob``; ids and
  logprobs come from ``output_ids`` and ``meta_info.output_token_logprobs`` (``[logprob, id, text]``).
  Streams may be cumulative (the default) or incremental (``--incremental-streaming-output``); both are
  handled. SGLang versions differ on whether logprobs are taken before or after temperature scaling
  (see its ``SGLANG_RETURN_ORIGINAL_LOGPROB`` setting); check yours when sampling at temperature != 1.

Routing: a request with a ``session_id`` goes to the healthy replica with the highest rendezvous hash
of (session_id, url), so a session stays on one replica (prefix-cache hits) and only sessions of a
failed replica move. Requests without one go to the replica with the fewest in-flight requests. A
replica that fails before streaming any token is marked down for ``cooldown_s`` and the request moves
to the next replica; a failure after tokens were streamed ends the stream with ``"abort"``.

A request with ``stream=False`` (the gateway sets it when its client did not ask for streaming) is sent
as one non-streamed upstream call whose single JSON body carries all ids and logprobs: no per-token SSE
events to frame and parse, which is most of this hop's cost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
from pydantic import Field

from polar.config.base import StrictModel, validate
from polar.config.sync import WeightSyncConfig
from polar.inference._http1 import Http1Pool, HttpError
from polar.inference.base import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    GenerationRequest,
    TokenEvent,
    UpstreamUnavailable,
)
from polar.inference.weight_sync import (
    LogprobCheck,
    WeightSyncError,
    control_for,
    prune_folders,
    write_weights_folder,
)

# the hot path parses ~one JSON object per token; orjson is several times faster than json
_loads = orjson.loads
_dumps = orjson.dumps

log = logging.getLogger(__name__)

UPSTREAM_KINDS = ("vllm", "sglang")


class UpstreamConfig(StrictModel):
    """An upstream inference service: one or more replicas of the same model."""

    kind: Literal["vllm", "sglang"]
    urls: list[str] = Field(min_length=1)
    tokenizer: str = "tiny"  # "tiny" or a local HF folder with the served model's tokenizer
    served_model: str | None = None  # vLLM "model" field; default: the first id from GET /v1/models
    model_name: str | None = None  # name reported to clients; default: served_model or the tokenizer name
    context_length: int | None = None  # default: the tokenizer's model_max_length
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    cooldown_s: float = 10.0
    api_key: str | None = None
    health_timeout_s: float = Field(2.0, gt=0)  # each replica's GET /health probe
    health_ttl_s: float = Field(2.0, ge=0)  # how long a probe's answer is reused by /health


class _Replica:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.pool: Http1Pool | None = None  # keep-alive connections for non-streamed calls (per event loop)
        self.in_flight = 0
        self.down_until = 0.0

    def healthy(self, now: float) -> bool:
        return now >= self.down_until


class _ReplicaFailed(Exception):
    """Internal: this replica failed before any token was streamed; try another."""


class UpstreamEngine(Engine):
    """Streams generations from vLLM or SGLang replicas. Build with :func:`polar.inference.load_engine`."""

    def __init__(self, config: UpstreamConfig, tokenizer: Any | None = None) -> None:
        self.config = config
        self.kind = config.kind
        if tokenizer is None:
            tokenizer = _load_tokenizer(config.tokenizer)
        self.tokenizer = tokenizer
        self.served_model = config.served_model
        self.model_name = config.model_name or config.served_model or _name_of(config.tokenizer)
        max_len = getattr(tokenizer, "model_max_length", None)
        default_len = max_len if isinstance(max_len, int) and 0 < max_len < 10**7 else 32768
        self.context_length = int(config.context_length or default_len)
        self.policy_version = 0
        self.default_stop_token_ids = _stop_ids(tokenizer)
        self.replicas = [_Replica(u) for u in config.urls]
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._health: tuple[float, dict[str, Any]] | None = None  # (monotonic time, answer) of the last probe
        self._probe: asyncio.Task[dict[str, Any]] | None = None
        # weight sync (polar.inference.weight_sync): the served folder, where synced folders go, what serves now
        folder = Path(config.tokenizer).expanduser() if config.tokenizer != "tiny" else None
        if folder is not None and not folder.is_dir():  # a preset name: its converted folder
            from polar.inference.presets import get_preset, preset_folder

            folder = preset_folder(config.tokenizer) if get_preset(config.tokenizer) is not None else None
        self.model_folder: Path | None = folder.resolve() if folder is not None else None
        # the folder the servers loaded (a launched vLLM of a tied-embeddings model: an untied copy of
        # model_folder): its config goes into every sync folder, and a failed sync's replicas reload it
        self.served_folder: Path | None = self.model_folder
        self.weights_dtype = "float32"  # what sync.dtype: auto writes (a launched vLLM: its --dtype)
        # recorded with every call: vLLM's default --logprobs-mode is raw_logprobs (the model's, before any
        # temperature or top-p); SGLang's depends on its version and SGLANG_RETURN_ORIGINAL_LOGPROB
        self.logprob_mode = "raw_logprobs" if self.kind == "vllm" else "sglang (version-dependent)"
        self.sync_config = WeightSyncConfig()
        self._sync_root: Path | None = None
        self._sync_tmp = False
        self._sync_lock = threading.Lock()  # one sync (or restarted-replica restore) at a time
        self._current_folder: Path | None = None  # the folder every replica serves; None: the base weights
        self._check: LogprobCheck | None = None
        self.sync_hooks: list[Callable[[Path], None]] = []  # called with each written folder before the push
        self.last_sync: dict[str, Any] = {}
        self._nccl: dict[str, Any] = {}  # url -> VllmNcclSender (gateway.sync.method: nccl)

    @classmethod
    def from_config(cls, spec: Mapping[str, Any] | UpstreamConfig, **kwargs: Any) -> UpstreamEngine:
        config = (
            spec if isinstance(spec, UpstreamConfig) else validate(UpstreamConfig, dict(spec), "upstream")
        )
        return cls(config, **kwargs)

    @classmethod
    def from_string(cls, spec: str, *, tokenizer: str = "tiny", **kwargs: Any) -> UpstreamEngine:
        """``"vllm:http://h1:8000,http://h2:8000"`` or ``"sglang:http://h:30000"``."""
        kind, _, rest = spec.partition(":")
        urls = [u.strip() for u in rest.split(",") if u.strip()]
        if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
            raise EngineError(
                f"upstream spec '{spec}' needs one or more http(s) URLs after '{kind}:', "
                f"e.g. '{kind}:http://127.0.0.1:8000,http://127.0.0.1:8001'"
            )
        return cls(UpstreamConfig(kind=kind, urls=urls, tokenizer=tokenizer), **kwargs)  # type: ignore[arg-type]

    def check_reachable(self, config_key: str = "model") -> None:
        """At start: every replica's ``GET /health`` (and, for vLLM, ``GET /v1/models``, which also
        resolves the served model). None answering is an error naming ``config_key``: a wrong URL
        fails now, in one line, not as every later call's 503. Some answering only warns (degraded)."""
        problems: list[str] = []
        timeout = httpx.Timeout(self.config.connect_timeout_s)
        with httpx.Client(timeout=timeout, headers=self._auth()) as client:
            for replica in self.replicas:
                problem = _probe_sync(client, replica.url, self.kind)
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

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

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

    # ------------------------------------------------------------------ routing
    def route(self, session_id: str | None) -> list[_Replica]:
        """Replicas in the order to try: sticky (rendezvous hash) for sessions, least-loaded otherwise."""
        now = time.monotonic()
        if session_id is not None:
            ranked = sorted(self.replicas, key=lambda r: _hrw(session_id, r.url), reverse=True)
        else:
            ranked = sorted(self.replicas, key=lambda r: r.in_flight)
        healthy = [r for r in ranked if r.healthy(now)]
        return healthy + [r for r in ranked if not r.healthy(now)]  # down ones last, as a last resort

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            timeout = httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s)
            headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            headers["Content-Type"] = "application/json"
            # keep a warm connection per concurrent call (httpx's default keeps 20), one client for all replicas
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=60.0)
            self._client = httpx.AsyncClient(timeout=timeout, headers=headers, limits=limits)
            self._client_loop = loop
            auth = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            for replica in self.replicas:
                if replica.pool is not None:
                    replica.pool.close()
                replica.pool = Http1Pool(replica.url, auth)
        return self._client

    # ------------------------------------------------------------------ Engine API
    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
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
            except _ReplicaFailed as exc:
                replica.down_until = time.monotonic() + self.config.cooldown_s
                if streamed:  # tokens already went out: the call cannot move; end it as aborted
                    log.warning("upstream %s failed mid-stream: %s", replica.url, exc)
                    yield TokenEvent(None, None, "abort", self.policy_version)
                    return
                errors.append(f"{replica.url}: {exc}")
                log.warning("upstream %s failed, trying the next replica: %s", replica.url, exc)
            finally:
                replica.in_flight -= 1
        raise UpstreamUnavailable(f"no {self.kind} replica could serve the request: {'; '.join(errors)}")

    # ------------------------------------------------------------------ weight sync
    def configure_sync(self, config: WeightSyncConfig, default_dir: str | Path | None = None) -> None:
        """How :meth:`update_weights` pushes weights: the gateway calls this with ``gateway.sync`` and a
        folder next to its records (``sync.dir`` wins); without either, a temporary folder."""
        self.sync_config = config
        chosen = config.dir or default_dir
        self._sync_root = Path(chosen).expanduser() if chosen else None
        if config.method == "nccl":
            from polar.inference.weight_sync import check_nccl_available

            check_nccl_available(self.kind)

    def _sync_dir(self) -> Path:
        if self._sync_root is None:
            import tempfile

            self._sync_root = Path(tempfile.mkdtemp(prefix="polar-weight-sync-"))
            self._sync_tmp = True
        return self._sync_root

    def _source_folder(self) -> Path:
        """The served model's folder: its config and tokenizer files go into every sync folder."""
        folder = self.model_folder
        if folder is None or not (folder / "config.json").is_file():
            raise WeightSyncError(
                f"{self.kind} upstream weights cannot be synced: the engine has no local model folder (tokenizer "
                f"{self.config.tokenizer!r}); set the upstream tokenizer to the served model's folder (it needs "
                "config.json), or sync through the server's own API and call update_weights({}, version)"
            )
        return folder

    def _pushable(self, replica: _Replica) -> bool:
        """Replicas a sync pushes to now (a launched replica that is restarting gets them when it is back)."""
        return True

    async def abort_inflight(self) -> int:
        """``sync.in_flight: abort``: end every request under way on every replica (they finish as ``abort``)."""
        control = control_for(self.kind)
        async with httpx.AsyncClient(headers=self._auth()) as client:
            for replica in self.replicas:
                if self._pushable(replica):
                    try:
                        await control.abort_all(client, replica.url, self.sync_config.timeout_s)
                    except WeightSyncError as exc:
                        log.warning("could not abort the calls in flight: %s", exc)
        return len(self.replicas)

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Push ``state_dict`` into every replica and stamp ``version`` on later records (see
        :mod:`polar.inference.weight_sync`). On any failure (a push rejected, a replica unreachable, the
        logprob check off by more than ``sync.check_tolerance``) every replica is given the previous weights
        back, the version stays, and :class:`WeightSyncError` says what happened, with numbers.

        An empty ``state_dict`` only stamps ``version``: for weights synced through the server's own API."""
        if not state_dict:
            self.policy_version = int(version)
            return
        await asyncio.to_thread(self._sync_lock.acquire)
        try:
            await self._sync(state_dict, int(version))
        finally:
            self._sync_lock.release()

    def _checker(self) -> LogprobCheck | None:
        cfg = self.sync_config
        if not cfg.check:
            return None
        if self._check is None:
            self._check = LogprobCheck(self._source_folder(), self.tokenizer, cfg.check_prompt, cfg.check_tokens,
                                       cfg.check_tolerance)
        return self._check

    async def _sync(self, state_dict: Mapping[str, Any], version: int) -> None:
        self._source_folder()
        source = self.served_folder or self._source_folder()
        if source != self.model_folder and "lm_head.weight" not in state_dict:  # served untied: lm_head too
            embed = next((v for k, v in state_dict.items() if k.endswith("embed_tokens.weight")), None)
            if embed is not None:
                state_dict = {**state_dict, "lm_head.weight": embed}
        root = self._sync_dir()
        t0 = time.monotonic()
        folder = await asyncio.to_thread(write_weights_folder, state_dict, source, root, version, self._weights_dtype())
        for hook in list(self.sync_hooks):  # tests: corrupt the folder "in transit"
            hook(folder)
        t_write = time.monotonic() - t0
        control = control_for(self.kind)
        targets = [r for r in self.replicas if self._pushable(r)]
        if not targets:
            shutil.rmtree(folder, ignore_errors=True)
            raise WeightSyncError(f"weight sync to version {version}: no {self.kind} replica is serving to take it")
        pushed: list[_Replica] = []
        checks: dict[str, Any] = {}
        check = self._checker()
        async with httpx.AsyncClient(headers=self._auth()) as client:
            try:
                for replica in targets:
                    pushed.append(replica)
                    await self._push(client, control, replica.url, folder, version)
                t_push = time.monotonic() - t0 - t_write
                if check is not None:
                    await asyncio.to_thread(check.load, state_dict)
                    for replica in targets:
                        report = await self._check_replica(client, check, replica.url)
                        checks[replica.url] = report
                        if not report["ok"]:
                            raise WeightSyncError(
                                f"weight sync to version {version} refused: {self.kind} replica {replica.url} does not "
                                f"serve the learner's weights: on the fixed prompt its logprobs differ from the "
                                f"learner's by up to {report['max_abs_diff']:.4f} (mean {report['mean_abs_diff']:.4f} "
                                f"over {report['tokens']} tokens; token {report['worst_token']}: replica "
                                f"{report['replica_logprob']:.4f}, learner {report['learner_logprob']:.4f}), over "
                                f"gateway.sync.check_tolerance={report['tolerance']:g}"
                            )
            except BaseException as exc:
                await self._roll_back(client, control, pushed, check)
                shutil.rmtree(folder, ignore_errors=True)
                if isinstance(exc, WeightSyncError):
                    raise WeightSyncError(f"{exc}; every replica serves version {self.policy_version} again") from None
                raise
        previous, self._current_folder = self._current_folder, folder
        self.policy_version = version
        prune_folders(root, keep=folder)
        self.last_sync = {"version": version, "folder": str(folder), "write_s": round(t_write, 3),
                          "push_s": round(t_push, 3), "total_s": round(time.monotonic() - t0, 3),
                          "replicas": len(targets), "checks": checks}
        log.info("weights v%d synced into %d %s replica(s) in %.2fs (write %.2fs, push %.2fs)%s", version,
                 len(targets), self.kind, self.last_sync["total_s"], t_write, t_push,
                 "" if not checks else "; logprob check max |diff| "
                 + ", ".join(f"{c['max_abs_diff']:.4f}" for c in checks.values()))
        del previous

    async def _push(self, client: httpx.AsyncClient, control: Any, url: str, folder: Path, version: int,
                    from_disk: bool = False) -> None:
        """Pause one replica, reload ``folder`` and set ``version``, resume it (resumed even on failure).
        With ``gateway.sync.method: nccl`` the tensors are broadcast instead (vLLM on GPU; see
        :class:`~polar.inference.weight_sync.VllmNcclSender`), from the folder's file, except ``from_disk``
        (rollbacks and restarted replicas reload the folder)."""
        timeout_s = self.sync_config.timeout_s
        await control.pause(client, url, self.sync_config.in_flight, timeout_s)
        try:
            if self.sync_config.method == "nccl" and not from_disk:
                from safetensors.torch import load_file

                from polar.inference.weight_sync import VllmNcclSender

                sender = self._nccl.setdefault(url, VllmNcclSender(url, timeout_s))
                state = await asyncio.to_thread(load_file, str(folder / "model.safetensors"))
                await asyncio.to_thread(sender.send, state, version)
            else:
                await control.load(client, url, folder, version, timeout_s)
        finally:
            await control.resume(client, url, timeout_s)

    async def _roll_back(self, client: httpx.AsyncClient, control: Any, pushed: list[_Replica],
                         check: LogprobCheck | None) -> None:
        """Give every replica that took (part of) a failed sync the weights it served before."""
        old = self._current_folder or self.served_folder or self._source_folder()
        for replica in pushed:
            try:
                await self._push(client, control, replica.url, old, self.policy_version, from_disk=True)
            except Exception as exc:  # it keeps failing: say so; the caller's error fails the step anyway
                log.error("could not restore version %d on %s after a failed sync: %s", self.policy_version,
                          replica.url, exc)
        if check is not None and check.loaded:
            await asyncio.to_thread(self._reload_check, check, old)

    @staticmethod
    def _reload_check(check: LogprobCheck, folder: Path) -> None:
        from safetensors.torch import load_file

        files = sorted(folder.glob("*.safetensors"))
        if not files:  # the served base folder in another format: rebuild from it
            check._model, check.loaded = None, False
            return
        for f in files:
            check.load(load_file(str(f)))

    async def _check_replica(self, client: httpx.AsyncClient, check: LogprobCheck, url: str) -> dict[str, Any]:
        """The fixed prompt's greedy continuation on one replica, compared with the learner's logprobs."""
        request = GenerationRequest(list(check.prompt_ids), max_tokens=check.tokens, temperature=0.0, stream=False)
        if self.kind == "vllm":
            path, body = "/v1/completions", await self._vllm_body(request, check.tokens)
            parse: Any = _VllmParser(request.prompt_ids)
        else:
            path, body = "/generate", _sglang_body(request, check.tokens)
            parse = _SglangParser()
        try:
            resp = await client.post(f"{url}{path}", content=_dumps(body), timeout=self.sync_config.timeout_s,
                                     headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{url}: the check call (POST {path}) failed: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise WeightSyncError(f"{url}: the check call (POST {path}) answered HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            triples = parse(_payload(resp.content))
        except _ReplicaFailed as exc:
            raise WeightSyncError(f"{url}: the check call failed: {exc}") from None
        ids = [int(t) for t, _, _ in triples if t is not None]
        lps = [float(lp) for t, lp, _ in triples if t is not None]
        return await asyncio.to_thread(check.compare, ids, lps)

    def _weights_dtype(self) -> str:
        chosen = self.sync_config.dtype
        return self.weights_dtype if chosen == "auto" else chosen

    async def restore_replica(self, url: str) -> None:
        """A replica that came back (restarted) holds the base weights: give it the current ones, and check
        it, before it serves. Runs on the caller's thread (its own event loop), under the sync lock."""
        folder = self._current_folder
        if folder is None:
            return  # nothing was synced yet: the base weights are the current ones
        control = control_for(self.kind)
        self._nccl.pop(url, None)  # a restarted replica has left its NCCL group
        async with httpx.AsyncClient(headers=self._auth()) as client:
            await self._push(client, control, url, folder, self.policy_version, from_disk=True)
            check = self._checker()
            if check is not None and check.loaded:
                report = await self._check_replica(client, check, url)
                if not report["ok"]:
                    raise WeightSyncError(
                        f"{url} came back but does not serve version {self.policy_version}: its fixed-prompt "
                        f"logprobs differ from the learner's by up to {report['max_abs_diff']:.4f} "
                        f"(tolerance {report['tolerance']:g})")
        log.info("restarted %s replica %s serves version %d again", self.kind, url, self.policy_version)

    async def close(self) -> None:
        if self._sync_tmp and self._sync_root is not None:
            shutil.rmtree(self._sync_root, ignore_errors=True)
        for replica in self.replicas:
            if replica.pool is not None:
                try:
                    replica.pool.close()
                except RuntimeError:  # created on an event loop that is gone
                    pass
                replica.pool = None
        if self._client is not None:
            try:
                await self._client.aclose()
            except RuntimeError:  # created on an event loop that is gone
                pass
            self._client = None

    async def health(self) -> dict[str, Any]:
        """Each replica's ``GET /health``, probed concurrently with ``health_timeout_s`` each, the answer
        reused for ``health_ttl_s``; concurrent callers share one probe. So ``/health`` on the gateway
        costs the replicas at most one probe per TTL and never waits longer than one timeout."""
        cached = self._health
        if cached is not None and time.monotonic() - cached[0] < self.config.health_ttl_s:
            return cached[1]
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._probe_replicas())
        return await asyncio.shield(self._probe)

    async def _probe_replicas(self) -> dict[str, Any]:
        states = await asyncio.gather(*(self._probe_one(r) for r in self.replicas))
        up = sum(s["state"] == "ok" for s in states)
        state = "ok" if up == len(states) else "degraded" if up else "unavailable"
        answer: dict[str, Any] = {"state": state, "kind": self.kind, "replicas": states}
        if not up:
            answer["error"] = f"no {self.kind} replica answered GET /health"
        self._health = (time.monotonic(), answer)
        return answer

    async def _probe_one(self, replica: _Replica) -> dict[str, Any]:
        timeout_s = self.config.health_timeout_s
        out: dict[str, Any] = {"url": replica.url, "in_flight": replica.in_flight}
        try:
            resp = await self._http().get(f"{replica.url}/health", timeout=httpx.Timeout(timeout_s))
        except httpx.TimeoutException:
            return {**out, "state": "down", "error": f"no answer to GET /health within {timeout_s}s"}
        except httpx.HTTPError as exc:
            return {**out, "state": "down", "error": f"{type(exc).__name__}: {exc}"}
        if resp.status_code != 200:
            return {**out, "state": "down", "error": f"GET /health answered HTTP {resp.status_code}"}
        cooling_s = replica.down_until - time.monotonic()
        if cooling_s > 0:  # answers its probe, but a request failed on it moments ago
            out["cooldown_s"] = round(cooling_s, 3)
        return {**out, "state": "ok"}

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

    # ------------------------------------------------------------------ wire formats
    async def _stream(
        self, replica: _Replica, request: GenerationRequest, max_tokens: int
    ) -> AsyncIterator[TokenEvent]:
        if self.kind == "vllm":
            url, body = f"{replica.url}/v1/completions", await self._vllm_body(request, max_tokens)
            parse = _VllmParser(request.prompt_ids)
        else:
            url, body = f"{replica.url}/generate", _sglang_body(request, max_tokens)
            parse = _SglangParser()
        content = _dumps(body)
        if not request.stream:
            for event in await self._whole(replica, request, url[len(replica.url) :], content, parse):
                yield event
            return
        try:
            async with self._http().stream("POST", url, content=content) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    self._raise_for_status(replica, resp.status_code, text, request)
                payloads = _sse_payloads(resp)
                async for payload in payloads:
                    events = [
                        TokenEvent(t, lp, finish, self.policy_version if finish else None)
                        for t, lp, finish in parse(payload)
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
                raise _ReplicaFailed("stream ended without a finish reason")
        except httpx.HTTPError as exc:
            raise _ReplicaFailed(f"{type(exc).__name__}: {exc}") from exc

    async def _whole(
        self, replica: _Replica, request: GenerationRequest, path: str, content: bytes, parse: Any
    ) -> list[TokenEvent]:
        """One non-streamed call: the body holds every id and logprob (vLLM and SGLang alike)."""
        self._http()  # (re)builds the replica pools for this event loop
        assert replica.pool is not None
        cfg = self.config
        try:
            status, data = await replica.pool.post(path, content, cfg.timeout_s, cfg.connect_timeout_s)
        except HttpError as exc:
            raise _ReplicaFailed(str(exc)) from exc
        if status != 200:
            self._raise_for_status(replica, status, data.decode("utf-8", "replace"), request)
        payload = _payload(data)
        triples = parse(payload)
        if not triples or triples[-1][2] is None:
            raise _ReplicaFailed("response has no finish reason")
        version = self.policy_version
        return [TokenEvent(t, lp, finish, version if finish else None) for t, lp, finish in triples]

    def _raise_for_status(
        self, replica: _Replica, status: int, text: str, request: GenerationRequest
    ) -> None:
        if status >= 500 or status in (408, 429):
            raise _ReplicaFailed(f"HTTP {status}: {text[:300]}")
        if "context length" in text.lower() or "context_length" in text.lower():
            raise ContextLengthExceeded(len(request.prompt_ids), self.context_length)
        raise EngineError(
            f"{self.kind} replica {replica.url} rejected the request (HTTP {status}): {text[:500]}"
        )

    async def _vllm_body(self, request: GenerationRequest, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": await self.resolve_served_model(),
            "prompt": list(request.prompt_ids),
            "max_tokens": max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "stop_token_ids": list(request.stop_token_ids),
            "logprobs": 0,  # the sampled token's logprob only: no top-k gather, no per-token top dict
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stream": request.stream,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        return body


def _sglang_body(request: GenerationRequest, max_tokens: int) -> dict[str, Any]:
    params: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop_token_ids": list(request.stop_token_ids),
        "skip_special_tokens": False,
    }
    if request.seed is not None:
        params["sampling_seed"] = request.seed
    return {
        "input_ids": list(request.prompt_ids),
        "sampling_params": params,
        "return_logprob": True,
        "stream": request.stream,
    }


async def _sse_payloads(resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Yield the JSON objects of an SSE stream (``data: {...}`` events) up to ``data: [DONE]``.

    Works on raw bytes (split on blank lines) rather than decoded text lines: a third of the cost."""
    done = False
    buf = b""
    async for chunk in resp.aiter_bytes():  # read to EOF, so the connection is reused, not closed
        if done:
            continue
        buf += chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *events, buf = buf.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                yield _payload(data)
            if done:
                break
    if not done and buf.strip():
        for line in buf.split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                yield _payload(line[5:].strip())


def _payload(data: bytes) -> Any:
    try:
        payload = _loads(data)
    except ValueError as exc:
        raise _ReplicaFailed(f"malformed upstream JSON: {data[:200]!r}") from exc
    if isinstance(payload, dict) and "error" in payload:
        raise _ReplicaFailed(f"upstream error: {str(payload['error'])[:300]}")
    return payload


Emitted = list[tuple[int, float, Any]]


class _VllmParser:
    """Turn vLLM /v1/completions stream chunks into (id, logprob, finish) triples."""

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt_ids = list(prompt_ids)

    def __call__(self, chunk: dict[str, Any]) -> Emitted:
        choices = chunk.get("choices") or []
        if not choices:
            return []  # e.g. a usage-only chunk
        choice = choices[0]
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and list(echoed) != self.prompt_ids:
            raise EngineError(
                "vLLM reports different prompt_token_ids than were sent; capture would be unfaithful"
            )
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs") or []
        ids = choice.get("token_ids")
        if ids is None:  # older vLLM: recover ids from "token_id:N" strings
            ids = [_id_from_token_string(t) for t in lp.get("tokens") or []]
        if len(logprobs) != len(ids):
            raise EngineError(
                f"vLLM chunk has {len(ids)} token ids but {len(logprobs)} logprobs; enable logprobs on the server"
            )
        finish = _finish(choice.get("finish_reason"))
        out: Emitted = [
            (int(t), float(p if p is not None else 0.0), None) for t, p in zip(ids, logprobs, strict=False)
        ]
        if finish is not None:
            if not out:
                return [(None, None, finish)]  # type: ignore[list-item]
            out[-1] = (out[-1][0], out[-1][1], finish)
        return out


class _SglangParser:
    """Turn SGLang /generate stream chunks (cumulative or incremental) into (id, logprob, finish) triples."""

    def __init__(self) -> None:
        self.emitted = 0

    def __call__(self, chunk: dict[str, Any]) -> Emitted:
        meta = chunk.get("meta_info") or {}
        ids = list(chunk.get("output_ids") or [])
        lps = list(meta.get("output_token_logprobs") or [])
        total = int(meta.get("completion_tokens", len(ids)))
        if len(ids) == total:  # cumulative chunk (SGLang's default): keep only the new tail
            ids = ids[self.emitted :]
            if len(lps) == total:
                lps = lps[self.emitted :]
        if len(lps) != len(ids):
            raise EngineError(
                f"SGLang chunk has {len(ids)} new ids but {len(lps)} logprobs; send return_logprob=true"
            )
        out: Emitted = []
        for token_id, entry in zip(ids, lps, strict=False):
            logprob, lp_id = entry[0], entry[1]
            if int(lp_id) != int(token_id):
                raise EngineError(f"SGLang logprob entry is for token {lp_id} but output id is {token_id}")
            out.append((int(token_id), float(logprob if logprob is not None else 0.0), None))
        self.emitted += len(out)
        reason = meta.get("finish_reason")
        finish = _finish(reason.get("type") if isinstance(reason, dict) else reason)
        if finish is not None:
            if not out:
                return [(None, None, finish)]  # type: ignore[list-item]
            out[-1] = (out[-1][0], out[-1][1], finish)
        return out


def _finish(reason: Any) -> str | None:
    if reason is None:
        return None
    return reason if reason in ("stop", "length") else "abort"


def _id_from_token_string(token: str) -> int:
    if not isinstance(token, str) or not token.startswith("token_id:"):
        raise EngineError("vLLM returned neither token_ids nor 'token_id:N' tokens; upgrade vLLM (>= 0.10.2)")
    return int(token.removeprefix("token_id:"))


def _probe_sync(client: httpx.Client, url: str, kind: str) -> str | None:
    """Why ``url`` cannot serve as a ``kind`` replica, or None when its ``GET /health`` answers 200."""
    try:
        resp = client.get(f"{url}/health")
    except httpx.ConnectError as exc:
        return f"refused the connection (nothing listens there: {exc})"
    except httpx.TimeoutException:
        return f"did not answer GET /health within {client.timeout.connect}s"
    except httpx.HTTPError as exc:
        return f"failed GET /health ({type(exc).__name__}: {exc})"
    if resp.status_code != 200:
        return f"answered GET /health with HTTP {resp.status_code}: not a {kind} server, or not ready"
    return None


def _hrw(session_id: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{session_id}\x00{url}".encode(), digest_size=8).digest(), "big")


def _load_tokenizer(spec: str) -> Any:
    if spec == "tiny":
        from polar.inference.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer()
    from pathlib import Path

    from polar.inference.presets import get_preset, preset_folder

    if get_preset(spec) is not None:  # a preset with a folder (smollm2-135m): its converted folder's tokenizer
        spec = str(preset_folder(spec))
    if not Path(spec).expanduser().is_dir():
        raise EngineError(
            f"upstream tokenizer '{spec}' is not 'tiny' or a local folder; point it at a folder holding the "
            "served model's tokenizer (the gateway tokenizes, so it must match the server's)"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(spec).expanduser(), local_files_only=True)


def _name_of(spec: str) -> str:
    from pathlib import Path

    return spec if spec == "tiny" else Path(spec).name


def _stop_ids(tokenizer: Any) -> list[int]:
    ids: list[int] = []
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            ids.append(tid)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return ids
