"""Live weight sync into upstream engines (vLLM, SGLang): the weights folder, each server's control calls,
and the fixed-prompt logprob check that proves a replica serves the learner's weights.

The learner's weights go to every replica as a Hugging Face folder: ``model.safetensors`` plus the served
folder's config and tokenizer files, written to ``<sync dir>/.tmp-…`` and renamed to ``v<version>`` once
complete (a replica never sees a half-written folder); only the serving one is kept. Each replica then:

- vLLM (``VLLM_SERVER_DEV_MODE=1``, as polar launches it): ``POST /pause?mode=wait|abort``,
  ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}``,
  ``POST /update_weight_version`` ``{"new_version": "N"}``, ``POST /resume``; ``GET /weight_info`` reads
  the version back.
- SGLang: ``POST /pause_generation`` ``{"mode": "in_place"|"abort"}``, ``POST /update_weights_from_disk``
  ``{"model_path": DIR, "weight_version": "N", "flush_cache": true}`` (``{"success", "message",
  "num_paused_requests"}``, HTTP 400 when it fails), ``POST /continue_generation``; ``GET /model_info``
  reads ``weight_version`` back.

The check: each replica continues a fixed chat prompt greedily for ``check_tokens`` tokens with logprobs;
a CPU fp32 copy of the model holding exactly the pushed tensors scores the same tokens; the largest
per-token difference must stay within ``check_tolerance``. A replica in bf16 differs from the fp32
learner by a few hundredths; a corrupted tensor by far more.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from polar.inference.base import EngineError

if TYPE_CHECKING:
    from polar.inference.lora import LoraAdapter

log = logging.getLogger(__name__)

# files of a served model folder that are weights (never copied into a sync folder: the new ones replace them)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")
_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


class WeightSyncError(EngineError):
    """A weight push failed or its check did not hold; the replicas serve the previous weights again."""


# ---------------------------------------------------------------------------------------------- folder
def write_weights_folder(state_dict: Mapping[str, Any], source: Path, root: Path, version: int,
                         dtype: str = "float32", keep_lm_head: bool = False) -> Path:
    """``state_dict`` as ``root/v<version>`` (model.safetensors + ``source``'s config and tokenizer
    files), written to a temporary folder first and renamed into place when complete."""
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{int(version):06d}"
    tmp = root / f".tmp-v{int(version):06d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for item in source.iterdir():
            if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and not item.name.endswith(".index.json"):
                shutil.copy2(item, tmp / item.name)
        target = getattr(torch, _DTYPES.get(dtype, "float32"))
        tied = _tied_embeddings(source) and not keep_lm_head
        tensors: dict[str, Any] = {}
        for name, value in state_dict.items():
            if tied and name == "lm_head.weight":
                continue  # tied to the input embeddings: servers take it from there
            t = torch.as_tensor(value).detach()
            if t.is_floating_point() and t.dtype != target:
                t = t.to(target)
            tensors[name] = t.contiguous().cpu()
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "polar_policy_version": str(version)})
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def prune_folders(root: Path, keep: Path | None) -> None:
    """Remove every sync folder under ``root`` but ``keep`` (the one serving)."""
    if not root.is_dir():
        return
    for item in root.iterdir():
        if item.is_dir() and (item.name.startswith("v") or item.name.startswith(".tmp-")) and item != keep:
            shutil.rmtree(item, ignore_errors=True)


def untied_copy(folder: Path, target: Path, dtype: str = "float32") -> Path:
    """``folder`` itself when its model does not tie its input and output embeddings; else ``target``: the
    same model with ``tie_word_embeddings: false`` and ``lm_head.weight`` written out, rewritten only when
    ``folder`` changed. vLLM 0.32 reloads weights layer by layer, which leaves a tied ``lm_head`` holding
    the old embeddings; an untied one is reloaded like any other layer. Same logits as ``folder``."""
    import json

    from safetensors.torch import load_file

    if not _tied_embeddings(folder):
        return folder
    stamp = {"source": str(folder), "mtime_ns": max(f.stat().st_mtime_ns for f in folder.iterdir()), "dtype": dtype}
    marker = target / "polar-untied.json"
    try:
        if json.loads(marker.read_text()) == stamp:
            return target
    except (OSError, ValueError):
        pass
    state: dict[str, Any] = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(f)))
    if not state:
        raise WeightSyncError(f"{folder} has tied embeddings but no *.safetensors weights to untie for weight sync")
    embed = next((v for k, v in state.items() if k.endswith("embed_tokens.weight")), None)
    if embed is None:
        raise WeightSyncError(f"{folder}: tied embeddings, but no '*embed_tokens.weight' tensor to copy into lm_head")
    state.setdefault("lm_head.weight", embed.clone())
    tmp_root = target.parent / f".{target.name}-tmp"
    shutil.rmtree(tmp_root, ignore_errors=True)
    written = write_weights_folder(state, folder, tmp_root, 0, dtype, keep_lm_head=True)
    cfg = json.loads((written / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (written / "config.json").write_text(json.dumps(cfg, indent=2))
    (written / "polar-untied.json").write_text(json.dumps(stamp))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(written, target)
    shutil.rmtree(tmp_root, ignore_errors=True)
    return target


def _tied_embeddings(folder: Path) -> bool:
    import json

    try:
        return bool(json.loads((folder / "config.json").read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------- check
class LogprobCheck:
    """Scores a replica's greedy continuation of a fixed prompt with a CPU fp32 model that holds the pushed
    weights, so a replica serving anything else (a corrupted tensor, the base weights) is caught."""

    def __init__(self, folder: Path, tokenizer: Any, prompt: str, tokens: int, tolerance: float) -> None:
        self.folder = Path(folder)
        self.tokens = int(tokens)
        self.tolerance = float(tolerance)
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
        self.prompt_ids: list[int] = list(tokenizer.encode(rendered, add_special_tokens=False))
        self._model: Any = None
        self.loaded = False  # whether the model holds pushed weights (else: the served folder's own)

    def _build(self) -> Any:
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(self.folder, dtype=torch.float32,
                                                               local_files_only=True).eval()
        return self._model

    def load(self, state_dict: Mapping[str, Any]) -> None:
        """Hold ``state_dict`` (the pushed weights) from now on."""
        import torch

        model = self._build()
        current = model.state_dict()
        unknown = [k for k in state_dict if k not in current]
        if unknown:
            raise WeightSyncError(f"the weights to sync name {len(unknown)} tensors the served model does not have, "
                                  f"e.g. {unknown[:3]}; expected names like {list(current)[:3]}")
        with torch.no_grad():
            for name, value in state_dict.items():
                current[name].copy_(torch.as_tensor(value).to(current[name].dtype))
        self.loaded = True

    def load_adapter(self, adapter: LoraAdapter | None) -> None:
        """Hold the base weights with ``adapter`` on top (None: the base weights alone). The model gets peft
        adapters of the same shape once, and each sync copies only the adapter tensors in (a few MB),
        rather than rebuilding every adapted weight as base + B @ A."""
        model = self._build()
        if adapter is None:
            self._adapter_on = False
            self.loaded = True
            return
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        cfg = adapter.config
        if not hasattr(model, "peft_config"):
            lora = LoraConfig(r=adapter.rank, lora_alpha=float(cfg.get("lora_alpha", adapter.rank)),
                              target_modules=cfg.get("target_modules"), lora_dropout=0.0, bias="none",
                              use_rslora=bool(cfg.get("use_rslora", False)))
            with warnings.catch_warnings():  # peft reads transformers 5's deprecated name: not the user's to fix
                warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                        category=FutureWarning)
                model = self._model = get_peft_model(model, lora).eval()
        result = set_peft_model_state_dict(model, dict(adapter))
        if getattr(result, "unexpected_keys", None):
            raise WeightSyncError(f"the LoRA adapter holds {len(result.unexpected_keys)} tensors the served model "
                                  f"has no place for, e.g. {list(result.unexpected_keys)[:3]}")
        self._adapter_on = True
        self.loaded = True

    def reference(self, token_ids: list[int]) -> list[float]:
        """Logprobs of ``token_ids`` following the prompt, under the held weights (fp32)."""
        import torch

        model = self._build()
        ids = torch.tensor([self.prompt_ids + list(token_ids)], dtype=torch.long)
        adapters_off = hasattr(model, "disable_adapter") and not getattr(self, "_adapter_on", False)
        with torch.no_grad(), (model.disable_adapter() if adapters_off else contextlib.nullcontext()):
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
        logp = torch.log_softmax(logits[len(self.prompt_ids) - 1 : -1], dim=-1)
        return logp.gather(1, torch.tensor(token_ids, dtype=torch.long)[:, None])[:, 0].tolist()

    def compare(self, token_ids: list[int], logprobs: list[float]) -> dict[str, Any]:
        if not token_ids:
            raise WeightSyncError("the replica returned no tokens for the fixed check prompt")
        ref = self.reference(token_ids)
        diffs = [abs(a - b) if math.isfinite(a) else math.inf for a, b in zip(logprobs, ref, strict=True)]
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        return {"tokens": len(diffs), "max_abs_diff": round(max(diffs), 6),
                "mean_abs_diff": round(sum(diffs) / len(diffs), 6), "worst_token": worst,
                "replica_logprob": round(logprobs[worst], 6), "learner_logprob": round(ref[worst], 6),
                "tolerance": self.tolerance, "ok": max(diffs) <= self.tolerance}


# ---------------------------------------------------------------------------------------------- servers
async def _post(client: httpx.AsyncClient, url: str, path: str, what: str, json: Any = None,
                params: dict[str, str] | None = None, timeout_s: float = 300.0) -> Any:
    try:
        resp = await client.post(f"{url}{path}", json=json, params=params, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise WeightSyncError(f"{url}: {what} (POST {path}) failed: {type(exc).__name__}: {exc}") from None
    body: Any = None
    if resp.content:
        try:
            body = resp.json()
        except ValueError:
            body = resp.text[:300]
    if resp.status_code == 404 and path in ("/pause", "/collective_rpc", "/update_weight_version"):
        raise WeightSyncError(f"{url}: POST {path} is not served (HTTP 404): start vLLM with VLLM_SERVER_DEV_MODE=1 "
                              "(polar's launched replicas have it) so its weight-reload routes exist")
    if resp.status_code != 200 or (isinstance(body, dict) and body.get("success") is False):
        raise WeightSyncError(f"{url}: {what} (POST {path}) was rejected (HTTP {resp.status_code}): {str(body)[:500]}")
    return body


class VllmControl:
    """vLLM's dev-mode RL routes (vLLM 0.32: ``vllm/entrypoints/rl/online/api_router.py``)."""

    kind = "vllm"

    async def pause(self, client: httpx.AsyncClient, url: str, in_flight: str, timeout_s: float) -> None:
        mode = "abort" if in_flight == "abort" else "wait"
        await _post(client, url, "/pause", "pause", params={"mode": mode}, timeout_s=timeout_s)

    async def resume(self, client: httpx.AsyncClient, url: str, timeout_s: float) -> None:
        await _post(client, url, "/resume", "resume", timeout_s=timeout_s)

    async def load(self, client: httpx.AsyncClient, url: str, folder: Path, version: int, timeout_s: float) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}, "timeout": timeout_s}
        await _post(client, url, "/collective_rpc", "reload_weights", json=body, timeout_s=timeout_s + 30)
        await _post(client, url, "/update_weight_version", "update_weight_version",
                    json={"new_version": str(version)}, timeout_s=timeout_s)

    async def version(self, client: httpx.AsyncClient, url: str) -> str | None:
        try:
            resp = await client.get(f"{url}/weight_info", timeout=30.0)
            return str(resp.json().get("weight_version")) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    async def abort_all(self, client: httpx.AsyncClient, url: str, timeout_s: float) -> None:
        await _post(client, url, "/abort_requests", "abort_requests", json={}, timeout_s=timeout_s)


class SglangControl:
    """SGLang's documented weight-update routes (``sglang/srt/entrypoints/http_server.py``)."""

    kind = "sglang"

    async def pause(self, client: httpx.AsyncClient, url: str, in_flight: str, timeout_s: float) -> None:
        # the gateway has already drained its own calls, so in_place leaves nothing running to flush
        mode = "abort" if in_flight == "abort" else "in_place"
        await _post(client, url, "/pause_generation", "pause_generation", json={"mode": mode}, timeout_s=timeout_s)

    async def resume(self, client: httpx.AsyncClient, url: str, timeout_s: float) -> None:
        await _post(client, url, "/continue_generation", "continue_generation", json={}, timeout_s=timeout_s)

    async def load(self, client: httpx.AsyncClient, url: str, folder: Path, version: int, timeout_s: float) -> None:
        body = {"model_path": str(folder), "weight_version": str(version), "flush_cache": True}
        await _post(client, url, "/update_weights_from_disk", "update_weights_from_disk", json=body, timeout_s=timeout_s)

    async def version(self, client: httpx.AsyncClient, url: str) -> str | None:
        try:
            resp = await client.get(f"{url}/model_info", timeout=30.0)
            return str(resp.json().get("weight_version")) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    async def abort_all(self, client: httpx.AsyncClient, url: str, timeout_s: float) -> None:
        await _post(client, url, "/abort_request", "abort_request", json={"abort_all": True}, timeout_s=timeout_s)


def control_for(kind: str) -> VllmControl | SglangControl:
    return VllmControl() if kind == "vllm" else SglangControl()


__all__ = ["LogprobCheck", "SglangControl", "VllmControl", "WeightSyncError", "control_for", "prune_folders",
           "write_weights_folder"]


NCCL_UNTESTED = ("gateway.sync.method: nccl has never run: no test exercises it (polar's test machines have no GPU), "
                 "so it may fail in ways nobody has seen; gateway.sync.method: disk is the tested path")


def check_nccl_available(kind: str) -> None:
    """``gateway.sync.method: nccl`` needs vLLM's trainer-side weight-transfer engine in polar's own process.
    It has never run (no test runs it: the machines polar is tested on have no GPU), so choosing it says so."""
    log.warning(NCCL_UNTESTED)
    if kind != "vllm":
        raise WeightSyncError(f"gateway.sync.method: nccl is vLLM's weight-transfer API; {kind} servers sync "
                              "with method: disk")
    try:
        import vllm.distributed.weight_transfer.nccl_engine  # noqa: F401
    except ImportError as exc:
        raise WeightSyncError(
            f"gateway.sync.method: nccl needs vllm importable in polar's own process (the learner's, on a GPU "
            f"machine: {exc}); install vllm there, or use gateway.sync.method: disk") from None


class VllmNcclSender:
    """``gateway.sync.method: nccl`` (GPU; not run on these CPU machines): vLLM's own trainer-side NCCL
    weight-transfer engine broadcasts the tensors into one replica, whose workers join the group through
    ``POST /init_weight_transfer_engine``; each sync is ``/start_weight_update``, ``/update_weights`` (with the
    broadcast), ``/finish_weight_update``, then ``/update_weight_version``. The replica must be started with
    ``--weight-transfer-config '{"backend": "nccl"}'`` (for a launched one: in ``engine_kwargs.extra_args``)."""

    def __init__(self, url: str, timeout_s: float, master_address: str = "127.0.0.1") -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.master_address = master_address
        self._engine: Any = None
        self._source: Any = None

    def send(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Blocking (run it in a thread): the broadcast and the replica's receive rendezvous in NCCL."""
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        if self._source is None:
            class _StateSource(WeightSource):
                state: Mapping[str, Any] = {}

                def metadata(self) -> list[Any]:
                    return [ParamMeta(k, v.dtype, tuple(v.shape)) for k, v in self.state.items()]

                def __iter__(self):  # type: ignore[override]
                    return iter(self.state.items())

            self._source = _StateSource()
        self._source.state = {k: v.detach().cuda() for k, v in state_dict.items()}
        if self._engine is None:
            from polar.inference._http1 import free_port

            world = httpx.get(f"{self.url}/get_world_size", params={"include_dp": "false"}, timeout=30).json()
            info = NCCLTrainerInitInfo(self.master_address, free_port(), int(world["world_size"]) + 1, rank=0)
            self._engine = NCCLTrainerWeightTransferEngine.trainer_init(
                info, client=HTTPVLLMWeightSyncClient(self.url, timeout=self.timeout_s), source=self._source)
        self._engine.send_weights()
        resp = httpx.post(f"{self.url}/update_weight_version", json={"new_version": str(version)}, timeout=30)
        if resp.status_code != 200:
            raise WeightSyncError(f"{self.url}: update_weight_version answered HTTP {resp.status_code}: {resp.text[:300]}")
