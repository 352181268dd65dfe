"""Weight sync into upstream replicas: the learner's weights into every replica, checked, or none at all.

A sync writes the weights as a model folder (:func:`polar.inference.weight_sync.write_weights_folder`),
then, replica by replica, pauses it, has it reload the folder (or, ``gateway.sync.method: nccl``, receive
the tensors by broadcast) and resumes it; then the logprob check compares each replica's greedy
continuation of a fixed prompt with the learner's own logprobs. Any failure gives every replica that took
part the previous weights back, and the version stays. One sync (or restarted-replica restore) at a time.

A LoRA run's payload is a :class:`~polar.inference.lora.LoraAdapter` (the adapters only, a few MB):
:meth:`UpstreamWeightSync.sync_adapter` writes it as a peft folder, loads it into every replica under a new
name ``polar-v<version>`` (vLLM ``POST /v1/load_lora_adapter``; the base weights and the adapter serving
now stay untouched, so nothing pauses), checks the new name, and only then switches the engine's calls to
it; the oldest names beyond ``sync.keep_adapters`` are unloaded. A failed load or check unloads the new
name and leaves the previous adapter (and version) serving.

This is the one place that knows how weights reach a server; a new way is a new push here.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from polar.config.sync import WeightSyncConfig
from polar.inference.base import EngineError, GenerationRequest
from polar.inference.lora import LoraAdapter, prune_adapter_folders, write_adapter_folder
from polar.inference.upstream.config import UpstreamKind
from polar.inference.upstream.wire import ReplicaFailed, WireCall, payload
from polar.inference.weight_sync import (
    LogprobCheck,
    SglangControl,
    VllmControl,
    WeightSyncError,
    control_for,
    prune_folders,
    write_weights_folder,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from polar.inference.weight_sync import VllmNcclSender

log = logging.getLogger(__name__)

Control = VllmControl | SglangControl


class UpstreamWeightSync:
    """Pushes weights into the replicas ``targets()`` names, checks them, rolls back on any failure.

    ``model_folder``: the served model's folder (its config and tokenizer go into every sync folder; the
    check's reference model is built from it); ``served_folder``: what the servers loaded (a launched vLLM
    of a tied-embeddings model: an untied copy), reloaded by a failed sync's rollback; ``weights_dtype``:
    what ``sync.dtype: auto`` writes. ``call_for(request, max_tokens)`` builds the check's generation call."""

    def __init__(self, kind: UpstreamKind, tokenizer: PreTrainedTokenizerBase, tokenizer_spec: str,
                 model_folder: Path | None, targets: Callable[[], list[str]], auth: dict[str, str],
                 call_for: Callable[[GenerationRequest, int, str | None], Awaitable[WireCall]],
                 served_folder: Path | None = None, weights_dtype: str = "float32") -> None:
        self.kind = kind
        self.tokenizer = tokenizer
        self.tokenizer_spec = tokenizer_spec
        self.model_folder = model_folder
        self.served_folder = served_folder or model_folder
        self.weights_dtype = weights_dtype
        self._targets = targets
        self._auth = auth
        self._call_for = call_for
        self.config = WeightSyncConfig()
        self.root: Path | None = None  # where sync folders go
        self._root_is_temporary = False
        self.lock = threading.Lock()  # one sync (or restarted-replica restore) at a time
        self.current_folder: Path | None = None  # the folder every replica serves; None: the base weights
        self._check: LogprobCheck | None = None
        self.hooks: list[Callable[[Path], None]] = []  # called with each written folder before the push (tests)
        self.last: dict[str, Any] = {}  # the last successful sync: version, timings, each replica's check
        self._nccl: dict[str, VllmNcclSender] = {}  # url -> sender (gateway.sync.method: nccl)
        # LoRA runs: the adapter names every replica holds, oldest first (the last serves), and their folders
        self.adapters: list[str] = []
        self._adapter_folders: dict[str, Path] = {}
        self._adapter_payloads: dict[str, LoraAdapter] = {}  # the serving adapter (the check's rollback)
        self.lora_key = "gateway.sync.lora"  # where LoRA support is switched on; a launcher names its own key

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter name calls go to (``polar-v<version>``); None: the base (or full-synced) weights."""
        return self.adapters[-1] if self.adapters else None

    # ------------------------------------------------------------------ setup
    def configure(self, config: WeightSyncConfig, default_dir: str | Path | None = None) -> None:
        """``gateway.sync`` and a folder next to the gateway's records (``sync.dir`` wins); without either,
        a temporary folder, removed by :meth:`close`."""
        self.config = config
        chosen = config.dir or default_dir
        self.root = Path(chosen).expanduser() if chosen else None
        if config.method == "nccl":
            from polar.inference.weight_sync import check_nccl_available

            check_nccl_available(self.kind)

    def _sync_dir(self) -> Path:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="polar-weight-sync-"))
            self._root_is_temporary = True
        return self.root

    def source_folder(self) -> Path:
        """The served model's folder: its config and tokenizer files go into every sync folder."""
        folder = self.model_folder
        if folder is None or not (folder / "config.json").is_file():
            raise WeightSyncError(
                f"{self.kind} upstream weights cannot be synced: the engine has no local model folder (tokenizer "
                f"{self.tokenizer_spec!r}); set the upstream tokenizer to the served model's folder (it needs "
                "config.json), or sync through the server's own API and call update_weights({}, version)"
            )
        return folder

    def _checker(self) -> LogprobCheck | None:
        cfg = self.config
        if not cfg.check:
            return None
        if self._check is None:
            self._check = LogprobCheck(self.source_folder(), self.tokenizer, cfg.check_prompt, cfg.check_tokens,
                                       cfg.check_tolerance)
        return self._check

    def _dtype(self) -> str:
        chosen = self.config.dtype
        return self.weights_dtype if chosen == "auto" else chosen

    # ------------------------------------------------------------------ the sync
    async def abort_inflight(self) -> int:
        """``sync.in_flight: abort``: end every request under way on every replica (they finish as ``abort``)."""
        control = control_for(self.kind)
        urls = self._targets()
        async with httpx.AsyncClient(headers=self._auth) as client:
            for url in urls:
                try:
                    await control.abort_all(client, url, self.config.timeout_s)
                except WeightSyncError as exc:
                    log.warning("could not abort the calls in flight: %s", exc)
        return len(urls)

    async def sync(self, state_dict: Mapping[str, Any], version: int, serving_version: int) -> None:
        """Push ``state_dict`` as ``version`` into every target replica and check it; on any failure every
        replica serves ``serving_version`` again and :class:`WeightSyncError` says what happened, with numbers.
        The caller holds :attr:`lock` and stamps ``version`` once this returns."""
        self.source_folder()
        source = self.served_folder or self.source_folder()
        if source != self.model_folder and "lm_head.weight" not in state_dict:  # served untied: lm_head too
            embed = next((v for k, v in state_dict.items() if k.endswith("embed_tokens.weight")), None)
            if embed is not None:
                state_dict = {**state_dict, "lm_head.weight": embed}
        root = self._sync_dir()
        t0 = time.monotonic()
        folder = await asyncio.to_thread(write_weights_folder, state_dict, source, root, version, self._dtype())
        for hook in list(self.hooks):  # tests: corrupt the folder "in transit"
            hook(folder)
        t_write = time.monotonic() - t0
        control = control_for(self.kind)
        targets = self._targets()
        if not targets:
            shutil.rmtree(folder, ignore_errors=True)
            raise WeightSyncError(f"weight sync to version {version}: no {self.kind} replica is serving to take it")
        pushed: list[str] = []
        checks: dict[str, Any] = {}
        check = self._checker()
        t_push = 0.0
        async with httpx.AsyncClient(headers=self._auth) as client:
            try:
                for url in targets:
                    pushed.append(url)
                    await self._push(client, control, url, folder, version)
                t_push = time.monotonic() - t0 - t_write
                if check is not None:
                    await asyncio.to_thread(check.load, state_dict)
                    for url in targets:
                        report = await self._check_replica(client, check, url)
                        checks[url] = report
                        if not report["ok"]:
                            raise WeightSyncError(
                                f"weight sync to version {version} refused: {self.kind} replica {url} does not "
                                f"serve the learner's weights: on the fixed prompt its logprobs differ from the "
                                f"learner's by up to {report['max_abs_diff']:.4f} (mean {report['mean_abs_diff']:.4f} "
                                f"over {report['tokens']} tokens; token {report['worst_token']}: replica "
                                f"{report['replica_logprob']:.4f}, learner {report['learner_logprob']:.4f}), over "
                                f"gateway.sync.check_tolerance={report['tolerance']:g}"
                            )
            except BaseException as exc:
                await self._roll_back(client, control, pushed, check, serving_version)
                shutil.rmtree(folder, ignore_errors=True)
                if isinstance(exc, WeightSyncError):
                    raise WeightSyncError(f"{exc}; every replica serves version {serving_version} again") from None
                raise
        self.current_folder = folder
        prune_folders(root, keep=folder)
        written = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        self.last = {"version": version, "folder": str(folder), "bytes": written, "write_s": round(t_write, 3),
                     "push_s": round(t_push, 3), "total_s": round(time.monotonic() - t0, 3),
                     "replicas": len(targets), "checks": checks}
        log.info("weights v%d synced into %d %s replica(s) in %.2fs (write %.2fs, push %.2fs)%s", version,
                 len(targets), self.kind, self.last["total_s"], t_write, t_push,
                 "" if not checks else "; logprob check max |diff| "
                 + ", ".join(f"{c['max_abs_diff']:.4f}" for c in checks.values()))

    async def _push(self, client: httpx.AsyncClient, control: Control, url: str, folder: Path, version: int,
                    from_disk: bool = False) -> None:
        """Pause one replica, reload ``folder`` and set ``version``, resume it (resumed even on failure).
        With ``gateway.sync.method: nccl`` the tensors are broadcast instead (vLLM on GPU; see
        :class:`~polar.inference.weight_sync.VllmNcclSender`), from the folder's file, except ``from_disk``
        (rollbacks and restarted replicas reload the folder)."""
        timeout_s = self.config.timeout_s
        await control.pause(client, url, self.config.in_flight, timeout_s)
        try:
            if self.config.method == "nccl" and not from_disk:
                from safetensors.torch import load_file

                from polar.inference.weight_sync import VllmNcclSender

                sender = self._nccl.setdefault(url, VllmNcclSender(url, timeout_s))
                state = await asyncio.to_thread(load_file, str(folder / "model.safetensors"))
                await asyncio.to_thread(sender.send, state, version)
            else:
                await control.load(client, url, folder, version, timeout_s)
        finally:
            await control.resume(client, url, timeout_s)

    async def _roll_back(self, client: httpx.AsyncClient, control: Control, pushed: list[str],
                         check: LogprobCheck | None, serving_version: int) -> None:
        """Give every replica that took (part of) a failed sync the weights it served before."""
        old = self.current_folder or self.served_folder or self.source_folder()
        for url in pushed:
            try:
                await self._push(client, control, url, old, serving_version, from_disk=True)
            except Exception as exc:  # it keeps failing: say so; the caller's error fails the step anyway
                log.error("could not restore version %d on %s after a failed sync: %s", serving_version, url, exc)
        if check is not None and check.loaded:
            await asyncio.to_thread(_reload_check, check, old)

    async def _check_replica(self, client: httpx.AsyncClient, check: LogprobCheck, url: str,
                             model: str | None = None) -> dict[str, Any]:
        """The fixed prompt's greedy continuation on one replica (``model``: a LoRA adapter's name, else
        the current one), compared with the learner's logprobs."""
        request = GenerationRequest(list(check.prompt_ids), max_tokens=check.tokens, temperature=0.0, stream=False)
        call = await self._call_for(request, check.tokens, model if model is not None else self.adapter)
        t0 = time.monotonic()
        try:
            resp = await client.post(f"{url}{call.path}", content=call.body, timeout=self.config.timeout_s,
                                     headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            raise WeightSyncError(
                f"{url}: the check call (POST {call.path}) failed: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise WeightSyncError(
                f"{url}: the check call (POST {call.path}) answered HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            triples = call.parse(payload(resp.content))
        except ReplicaFailed as exc:
            raise WeightSyncError(f"{url}: the check call failed: {exc}") from None
        ids = [int(t) for t, lp, _ in triples if t is not None and lp is not None]
        lps = [float(lp) for t, lp, _ in triples if t is not None and lp is not None]
        t_replica = time.monotonic() - t0
        report: dict[str, Any] = await asyncio.to_thread(check.compare, ids, lps)
        report["replica_s"] = round(t_replica, 3)  # the replica's greedy call
        report["reference_s"] = round(time.monotonic() - t0 - t_replica, 3)  # the learner-side fp32 scoring
        return report

    # ------------------------------------------------------------------ LoRA adapters
    def check_lora_support(self, rank: int, key: str) -> None:
        """At start, for a LoRA run that syncs adapters: every replica must serve LoRA adapters of ``rank``
        and load them at run time. Asks vLLM's dev-mode ``GET /server_info`` (its ``lora_config``) and the
        load route; raises :class:`EngineError` in one line naming ``key`` otherwise."""
        if self.kind != "vllm":
            raise EngineError(f"{key}: LoRA adapter sync needs vLLM (its /v1/load_lora_adapter); {self.kind} "
                              "replicas take merged weights: set gateway.sync.lora: merged")
        with httpx.Client(headers=self._auth, timeout=httpx.Timeout(60.0)) as client:
            for url in self._targets():
                problem = _lora_problem(client, url, rank)
                if problem is not None:
                    raise EngineError(
                        f"{key}: a LoRA run (rank {rank}) syncs adapters only, but vLLM replica {url} {problem}; "
                        "start it with --enable-lora --max-lora-rank >= the rank and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 "
                        "(a launched vLLM: model.engine_kwargs.max_lora_rank), or set gateway.sync.lora: merged")

    async def sync_adapter(self, adapter: LoraAdapter, version: int, serving_version: int) -> None:
        """Load ``adapter`` into every target replica as ``polar-v<version>``, check it, then serve it; on any
        failure the new name is unloaded again, the previous adapter keeps serving as ``serving_version``, and
        :class:`WeightSyncError` says what happened. The caller holds :attr:`lock` and stamps ``version``."""
        cfg = self.config
        targets = self._targets()
        if not targets:
            raise WeightSyncError(f"weight sync to version {version}: no {self.kind} replica is serving to take it")
        name = f"polar-v{version}"
        t0 = time.monotonic()
        folder = await asyncio.to_thread(write_adapter_folder, adapter, self._sync_dir(), version, self._dtype())
        for hook in list(self.hooks):  # tests: corrupt the folder "in transit"
            hook(folder)
        t_write = time.monotonic() - t0
        check = self._checker()
        t_model = 0.0
        loaded: list[str] = []
        checks: dict[str, Any] = {}
        t_push = 0.0
        async with httpx.AsyncClient(headers=self._auth) as client:
            try:
                for url in targets:
                    await _load_adapter(client, url, name, folder, cfg.timeout_s)
                    loaded.append(url)
                t_push = time.monotonic() - t0 - t_write
                if check is not None:
                    t_model = time.monotonic()
                    await asyncio.to_thread(check.load_adapter, adapter)
                    t_model = time.monotonic() - t_model
                    for url in targets:
                        report = await self._check_replica(client, check, url, model=name)
                        checks[url] = report
                        if not report["ok"]:
                            raise WeightSyncError(
                                f"weight sync to version {version} refused: LoRA adapter {name} on {self.kind} "
                                f"replica {url} does not serve the learner's weights: on the fixed prompt its "
                                f"logprobs differ from the learner's by up to {report['max_abs_diff']:.4f} (mean "
                                f"{report['mean_abs_diff']:.4f} over {report['tokens']} tokens), over "
                                f"gateway.sync.check_tolerance={report['tolerance']:g}")
            except BaseException as exc:
                for url in loaded:
                    await _unload_adapter(client, url, name, cfg.timeout_s, quiet=True)
                if check is not None and check.loaded:
                    previous = self._adapter_payloads.get(self.adapter or "")
                    await asyncio.to_thread(check.load_adapter, previous)
                shutil.rmtree(folder, ignore_errors=True)
                if isinstance(exc, WeightSyncError):
                    serving = self.adapter or "the base weights"
                    raise WeightSyncError(f"{exc}; every replica serves version {serving_version} ({serving}) "
                                          "again") from None
                raise
            self.adapters.append(name)
            self._adapter_folders[name] = folder
            self._adapter_payloads = {name: adapter}  # the check's rollback target at the next sync
            t_swap = time.monotonic()
            while len(self.adapters) > cfg.keep_adapters:
                old = self.adapters.pop(0)
                for url in targets:
                    await _unload_adapter(client, url, old, cfg.timeout_s, quiet=True)
                self._adapter_folders.pop(old, None)
            prune_adapter_folders(self._sync_dir(), set(self._adapter_folders.values()))
        written = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        self.last = {"version": version, "adapter": name, "folder": str(folder), "bytes": written,
                     "write_s": round(t_write, 3), "push_s": round(t_push, 3),
                     "check_s": round(t_swap - t0 - t_write - t_push, 3),
                     "check_model_s": round(t_model, 3), "total_s": round(time.monotonic() - t0, 3),
                     "replicas": len(targets), "checks": checks, "adapters": list(self.adapters)}
        log.info("LoRA adapter %s (%.1f MB) synced into %d %s replica(s) in %.3fs (write %.3fs, load %.3fs)%s",
                 name, written / 1e6, len(targets), self.kind, self.last["total_s"], t_write, t_push,
                 "" if not checks else "; logprob check max |diff| "
                 + ", ".join(f"{c['max_abs_diff']:.4f}" for c in checks.values()))

    async def restore(self, url: str, version: int) -> None:
        """A replica that came back (restarted) holds the base weights: give it the current ones as
        ``version``, and check it, before it serves. The caller holds :attr:`lock`."""
        if self.adapters:  # a LoRA run: the kept adapters again, the current one checked
            async with httpx.AsyncClient(headers=self._auth) as client:
                for name in self.adapters:
                    await _load_adapter(client, url, name, self._adapter_folders[name], self.config.timeout_s)
                check = self._checker()
                if check is not None and check.loaded:
                    report = await self._check_replica(client, check, url)
                    if not report["ok"]:
                        raise WeightSyncError(
                            f"{url} came back but its adapter {self.adapter} does not serve version {version}: its "
                            f"fixed-prompt logprobs differ from the learner's by up to {report['max_abs_diff']:.4f}")
            return
        folder = self.current_folder
        if folder is None:
            return  # nothing was synced yet: the base weights are the current ones
        control = control_for(self.kind)
        self._nccl.pop(url, None)  # a restarted replica has left its NCCL group
        async with httpx.AsyncClient(headers=self._auth) as client:
            await self._push(client, control, url, folder, version, from_disk=True)
            check = self._checker()
            if check is not None and check.loaded:
                report = await self._check_replica(client, check, url)
                if not report["ok"]:
                    raise WeightSyncError(
                        f"{url} came back but does not serve version {version}: its fixed-prompt "
                        f"logprobs differ from the learner's by up to {report['max_abs_diff']:.4f} "
                        f"(tolerance {report['tolerance']:g})")
        log.info("restarted %s replica %s serves version %d again", self.kind, url, version)

    def close(self) -> None:
        """Remove the sync folders when they were in a temporary folder of this sync's own."""
        if self._root_is_temporary and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def _reload_check(check: LogprobCheck, folder: Path) -> None:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:  # the served base folder in another format: rebuild from it
        check._model, check.loaded = None, False
        return
    for f in files:
        check.load(load_file(str(f)))


# ---------------------------------------------------------------------------------------------- LoRA routes
def _lora_problem(client: httpx.Client, url: str, rank: int) -> str | None:
    """What keeps ``url`` from taking LoRA adapters of ``rank`` at run time (None: nothing)."""
    try:
        resp = client.get(f"{url}/server_info", params={"config_format": "json"})
        if resp.status_code == 404:
            return "does not serve GET /server_info (start it with VLLM_SERVER_DEV_MODE=1) to tell its LoRA support"
        info = resp.json()
        lora = (info.get("vllm_config") or {}).get("lora_config")
        runtime = str((info.get("vllm_env") or {}).get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "")).lower()
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return f"did not answer GET /server_info ({type(exc).__name__}: {exc})"
    if not lora:
        return "was started without LoRA support (no --enable-lora)"
    max_rank = int(lora.get("max_lora_rank") or 0)
    if max_rank < rank:
        return f"takes adapters up to rank {max_rank} (--max-lora-rank)"
    if runtime not in ("1", "true"):
        return "cannot load adapters at run time (VLLM_ALLOW_RUNTIME_LORA_UPDATING is not set)"
    return None


async def _load_adapter(client: httpx.AsyncClient, url: str, name: str, folder: Path, timeout_s: float) -> None:
    try:
        resp = await client.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(folder)},
                                 timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise WeightSyncError(f"{url}: loading LoRA adapter {name} failed: {type(exc).__name__}: {exc}") from None
    if resp.status_code != 200:
        raise WeightSyncError(f"{url}: loading LoRA adapter {name} from {folder} was rejected (HTTP "
                              f"{resp.status_code}): {resp.text[:300]}")


async def _unload_adapter(client: httpx.AsyncClient, url: str, name: str, timeout_s: float, quiet: bool) -> None:
    try:
        resp = await client.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=timeout_s)
        ok, why = resp.status_code == 200, f"HTTP {resp.status_code}: {resp.text[:200]}"
    except httpx.HTTPError as exc:
        ok, why = False, f"{type(exc).__name__}: {exc}"
    if not ok:
        if not quiet:
            raise WeightSyncError(f"{url}: unloading LoRA adapter {name} failed ({why})")
        log.warning("%s: could not unload LoRA adapter %s (%s)", url, name, why)
