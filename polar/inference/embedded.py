"""The embedded engine: Hugging Face transformers in-process, on CPU or GPU, with continuous batching.

A background thread owns the model. It admits queued requests, prefills each newcomer on its own
(no padded queries, so no fully masked attention rows), then merges its KV cache into the running
cohort and advances every active sequence by one token per forward pass (left-padded KV plus a 2D
attention mask and explicit position ids). Sequences join and leave between steps, so a long
generation never holds up a short one. Caches that cannot be merged (linear-attention layers) decode
per sequence instead. A finished sequence's KV is kept per session (:mod:`polar.inference.prefix_cache`),
so the session's next turn, whose prompt extends it, prefills only the new tail.

Logprobs are the raw model distribution's (log-softmax at temperature 1, before top-p), computed in
float32 from the same logits the token was sampled from; see :mod:`polar.inference.base`.

``update_weights`` takes the step lock, copies tensors in place, and aborts sequences that were in
flight (their KV caches belong to the old weights); queued requests then run under the new weights.
``update_weights_in_flight`` (partial rollouts) keeps them instead: each goes back to the front of the queue
with what it sampled so far appended to its prompt, so its next prefill recomputes its keys and values under
the new weights, and it goes on sampling there; every token's ``TokenEvent.policy_version`` is the version
of the weights that sampled it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import random
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from polar.inference.base import Engine, EngineError, FinishReason, GenerationRequest, TokenEvent
from polar.inference.kv import cache_from_kv, left_pad, plain_kv
from polar.inference.prefix_cache import PrefixCache, PrefixEntry
from polar.inference.sampling import sample_rows, sequence_logprobs, top_rows

log = logging.getLogger(__name__)

__all__ = ["EmbeddedEngine", "load_weights", "sample_rows", "sequence_logprobs"]


def load_weights(model: Any, state_dict: Mapping[str, Any]) -> None:
    """Copy ``state_dict`` into ``model`` in place. A subset of names is fine; unknown names or shape
    mismatches raise ``EngineError`` before anything is written."""
    current = model.state_dict()
    unknown = [k for k in state_dict if k not in current]
    if unknown:
        raise EngineError(
            f"update_weights: {len(unknown)} unknown parameter names, e.g. {unknown[:3]}; "
            f"expected names like {list(current)[:3]}"
        )
    for name, value in state_dict.items():
        if tuple(value.shape) != tuple(current[name].shape):
            raise EngineError(
                f"update_weights: '{name}' has shape {tuple(value.shape)} but the model expects "
                f"{tuple(current[name].shape)}"
            )
    with torch.no_grad():
        for name, value in state_dict.items():
            target = current[name]
            target.copy_(torch.as_tensor(value).to(device=target.device, dtype=target.dtype))


@dataclass(eq=False)
class _Seq:
    request: GenerationRequest
    max_tokens: int
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    generator: torch.Generator
    stops: frozenset[int]
    n_generated: int = 0
    last_token: int = -1
    cancelled: bool = False
    done: bool = False
    cache: Any = None  # only for sequences decoded on their own (caches that cannot be merged)
    sampled: list[int] = field(default_factory=list)

    def context(self) -> list[int]:
        """What the next prefill reads: the prompt, and after a weight update in flight what was sampled."""
        return self.request.prompt_ids + self.sampled if self.sampled else self.request.prompt_ids


class EmbeddedEngine(Engine):
    """In-process HF transformers engine. Build with :meth:`from_spec` (``"tiny"`` or a model folder)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str,
        context_length: int | None = None,
        max_batch_size: int = 32,
        default_stop_token_ids: list[int] | None = None,
        batch_decode: bool = True,
        prefix_cache_tokens: int = 65536,
        max_prefill_tokens: int = 8192,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_top_logprobs = 20
        self.continues_in_flight = True
        self.model_name = model_name
        self.device = next(model.parameters()).device
        cfg_len = getattr(model.config, "max_position_embeddings", None) or tokenizer.model_max_length
        self.context_length = int(context_length or cfg_len)
        self.max_batch_size = max_batch_size
        self.batch_decode = batch_decode  # False: every sequence decodes on its own (interleaved, unbatched)
        self.max_prefill_tokens = max_prefill_tokens  # padded tokens per batched prefill forward
        self._batch_prefill_ok = batch_decode
        self.prefix_cache = PrefixCache(prefix_cache_tokens)  # 0 disables; reuses a session's last KV
        self.stats: collections.Counter[str] = collections.Counter()  # prefill/decode counts, for metrics
        self.policy_version = 0
        if default_stop_token_ids is None:
            default_stop_token_ids = _eos_ids(model, tokenizer)
        self.default_stop_token_ids = list(default_stop_token_ids)
        self._vocab_limit = max(len(tokenizer), int(getattr(model.config, "vocab_size", 0) or 0))
        self._cv = threading.Condition()
        self._step_lock = threading.Lock()
        self._waiting = 0  # threads that want the step lock between two steps (a swap, an abort)
        self._pending: collections.deque[_Seq] = collections.deque()
        self._active: list[_Seq] = []  # the batched cohort, rows of self._kv
        self._solo: list[_Seq] = []  # sequences whose cache cannot be merged (e.g. linear-attention layers)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers 5 vs 4
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer, (B, H, L, D)
        self._mask: torch.Tensor | None = None  # (B, L) 1 = real token
        self._thread: threading.Thread | None = None
        self._closing = False

    @classmethod
    def from_spec(
        cls, spec: str, *, device: str | None = None, dtype: str | None = None, seed: int = 0, **kwargs: Any
    ) -> EmbeddedEngine:
        """``"tiny"`` (seeded random preset) or a local HF model folder (never downloads)."""
        from polar.inference.presets import get_preset, preset_folder, preset_names

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        preset = get_preset(spec)
        if preset is not None and preset.build is not None:  # built in memory (tiny)
            model, tokenizer = preset.build(seed)
            return cls(model.to(device), tokenizer, model_name=preset.name, **kwargs)
        path = preset_folder(spec) if preset is not None else Path(spec).expanduser()
        if not (path / "config.json").is_file():
            raise EngineError(
                f"model '{spec}' is neither 'tiny' nor a local Hugging Face model folder (no config.json at "
                f"{path}) nor another preset ({', '.join(n for n in preset_names() if n != 'tiny')}); pass --model "
                "tiny, a folder saved with save_pretrained, or an upstream like 'vllm:http://host:8000'"
            )
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch_dtype = getattr(torch, dtype) if dtype else (torch.float32 if device == "cpu" else "auto")
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch_dtype)
        return cls(model.to(device), tokenizer, model_name=preset.name if preset else path.name, **kwargs)

    # ------------------------------------------------------------------ public API
    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self._closing:
            raise EngineError("engine is closed")
        max_tokens = self.check_prompt(request)
        if any(t >= self._vocab_limit for t in request.prompt_ids):
            raise EngineError(f"prompt_ids contain ids >= the model vocabulary ({self._vocab_limit})")
        gen = torch.Generator(device=self.device)
        gen.manual_seed(request.seed if request.seed is not None else random.getrandbits(63))
        seq = _Seq(
            request=request,
            max_tokens=max_tokens,
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
            generator=gen,
            stops=frozenset(int(t) for t in request.stop_token_ids),
        )
        self._ensure_worker()
        with self._cv:
            self._pending.append(seq)
            self._cv.notify()
        try:
            while True:
                item = await seq.queue.get()
                if isinstance(item, BaseException):
                    raise EngineError(f"embedded engine failed: {item}") from item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            seq.cancelled = True

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        await asyncio.to_thread(self._swap_weights, state_dict, int(version))

    async def update_weights_in_flight(self, state_dict: Mapping[str, Any], version: int) -> None:
        await asyncio.to_thread(self._swap_weights, state_dict, int(version), True)

    async def abort_inflight(self) -> int:
        def _abort() -> int:
            with self._between_steps():
                n = len(self._active) + len(self._solo)
                self._abort_all()
                return n

        return await asyncio.to_thread(_abort)

    async def health(self) -> dict[str, Any]:
        if self._closing:
            return {"state": "unavailable", "error": "engine is closed"}
        return {"state": "ok", "device": str(self.device), "active": len(self._active) + len(self._solo),
                "queued": len(self._pending)}

    async def close(self) -> None:
        self._closing = True
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30.0)
        with self._step_lock:
            self._abort_all()
            with self._cv:
                for seq in self._pending:
                    self._emit(seq, TokenEvent(None, None, "abort", self.policy_version))
                self._pending.clear()

    @contextlib.contextmanager
    def _between_steps(self) -> Iterator[None]:
        """The step lock, taken at the next step boundary: the worker waits while someone does (a swap
        during a long generation would otherwise wait for the generation to end)."""
        with self._cv:
            self._waiting += 1
        try:
            with self._step_lock:
                yield
        finally:
            with self._cv:
                self._waiting -= 1
                self._cv.notify_all()

    # ------------------------------------------------------------------ worker thread
    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="polar-embedded-engine", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._closing:
            with self._cv:
                if self._waiting:  # let it in: a lock is not fair, and this loop would take it back at once
                    self._cv.wait(timeout=0.5)
                    continue
                if not self._pending and not self._active and not self._solo:
                    self._cv.wait(timeout=0.5)
                    continue
                room = self.max_batch_size - len(self._active) - len(self._solo)
                newcomers = [self._pending.popleft() for _ in range(min(room, len(self._pending)))]
            with self._step_lock:
                try:
                    self._step(newcomers)
                except Exception as exc:  # keep the engine alive; fail only the affected requests
                    log.exception("embedded engine step failed")
                    for seq in [*self._active, *self._solo, *newcomers]:
                        self._emit(seq, exc)
                    self._active, self._solo, self._kv, self._mask = [], [], None, None

    @torch.no_grad()
    def _step(self, newcomers: list[_Seq]) -> None:
        self._drop([s for s in self._active if s.cancelled])
        joining: list[tuple[_Seq, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        fresh: list[_Seq] = []
        for seq in newcomers:
            if seq.cancelled:
                continue
            hit = (
                self.prefix_cache.take(seq.request.session_id, seq.request.prompt_ids)
                if self.batch_decode and not seq.sampled  # a sequence resumed after a swap: no cache is its
                else None
            )
            if hit is not None or not self._batch_prefill_ok:
                joining += self._isolated([seq], lambda seq=seq, hit=hit: self._prefill_one(seq, hit))
            else:
                fresh.append(seq)
        for group in self._prefill_groups(fresh):
            joining += self._isolated(group, lambda group=group: self._prefill_batch(group))
        if joining:
            self._merge(joining)
        if self._active:
            self._decode()
        for seq in self._solo:
            if not seq.cancelled:
                self._decode_solo(seq)
        self._solo = [s for s in self._solo if not (s.done or s.cancelled)]

    def _forward(self, input_ids: torch.Tensor, cache: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """One forward with a KV cache; returns (last-position logits as float32, the updated cache)."""
        if cache is not None:
            kwargs[self._cache_kw] = cache
        out = self.model(input_ids=input_ids, use_cache=True, **kwargs)
        return out.logits[:, -1].float(), _cache_of(out)

    def _isolated(self, seqs: list[_Seq], prefill: Any) -> list[tuple[_Seq, Any]]:
        """Run a prefill; if it fails (e.g. out of memory on a huge prompt), fail only these requests."""
        try:
            return prefill()
        except Exception as exc:
            log.warning("prefill of %d request(s) failed: %s", len(seqs), exc)
            for seq in seqs:
                self._emit(seq, exc)
                self._solo = [s for s in self._solo if s is not seq]
            return []

    def _prefill_one(self, seq: _Seq, hit: PrefixEntry | None) -> list[tuple[_Seq, Any]]:
        kv = self._prefill(seq, hit)
        return [] if kv is None else [(seq, kv)]

    def _prefill_groups(self, seqs: list[_Seq]) -> list[list[_Seq]]:
        """Split newcomers into prefill batches of at most ``max_prefill_tokens`` padded tokens."""
        groups: list[list[_Seq]] = []
        group: list[_Seq] = []
        width = 0
        for seq in seqs:
            n = len(seq.context())
            if group and (len(group) + 1) * max(width, n) > self.max_prefill_tokens:
                groups.append(group)
                group, width = [], 0
            group.append(seq)
            width = max(width, n)
        return [*groups, group] if group else groups

    def _prefill_batch(self, seqs: list[_Seq]) -> list[tuple[_Seq, list[tuple[torch.Tensor, torch.Tensor]]]]:
        """Prefill several prompts in one right-padded forward (every query row sees at least one real
        key, so no row is fully masked); sample their first tokens; return the KV of those continuing."""
        if len(seqs) == 1:
            return self._prefill_one(seqs[0], None)
        lens = [len(s.context()) for s in seqs]
        width = max(lens)
        self.stats["prefill_forwards"] += 1
        self.stats["prefill_sequences"] += len(seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for row, seq in enumerate(seqs):
            ids[row, : lens[row]] = torch.tensor(seq.context())
            mask[row, : lens[row]] = 1
        last = sorted({n - 1 for n in lens})  # logits only where some row's prompt ends
        kwargs: dict[str, Any] = (
            {self._keep_kw: torch.tensor(last, device=self.device)} if self._keep_kw else {}
        )
        out = self.model(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=True, **kwargs
        )
        kv_all = plain_kv(_cache_of(out))
        if (
            kv_all is None
        ):  # e.g. linear-attention layers: rows cannot be split; prefill one by one from now on
            self._batch_prefill_ok = False
            return [(s, kv) for s in seqs if (kv := self._prefill(s, None)) is not None]
        cols = [last.index(n - 1) for n in lens] if self._keep_kw else [n - 1 for n in lens]
        rows = torch.arange(len(seqs), device=self.device)
        self._advance(seqs, out.logits[rows, torch.tensor(cols, device=self.device)].float())
        return [
            (s, [(k[row : row + 1, :, :n], v[row : row + 1, :, :n]) for k, v in kv_all])
            for row, (s, n) in enumerate(zip(seqs, lens, strict=True))
            if not s.done
        ]

    def _prefill(self, seq: _Seq, hit: PrefixEntry | None) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Prefill one prompt (past a cached prefix if ``hit``) and sample its first token; return the
        KV to merge into the cohort, if any."""
        prompt = seq.context()
        keep = {self._keep_kw: 1} if self._keep_kw else {}
        self.stats["prefill_forwards"] += 1
        self.stats["prefill_sequences"] += 1
        if hit is not None:  # prefill only the tail past this session's cached prefix
            ids = torch.tensor([prompt[len(hit.tokens) :]], dtype=torch.long, device=self.device)
            logits, cache = self._forward(ids, cache_from_kv(hit.kv), **keep)
        else:
            ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
            logits, cache = self._forward(
                ids, None, **keep
            )  # the model builds the right cache for its layers
        self._advance([seq], logits)
        if seq.done:
            return None
        kv = plain_kv(cache) if self.batch_decode else None
        if kv is None:
            seq.cache = cache
            self._solo.append(seq)
        return kv

    def _decode_solo(self, seq: _Seq) -> None:
        ids = torch.tensor([[seq.last_token]], dtype=torch.long, device=self.device)
        logits, seq.cache = self._forward(ids, seq.cache)
        self._advance([seq], logits)
        if seq.done:
            seq.cache = None

    def _decode(self) -> None:
        self.stats["decode_steps"] += 1
        assert self._kv is not None and self._mask is not None
        batch = len(self._active)
        input_ids = torch.tensor([[s.last_token] for s in self._active], dtype=torch.long, device=self.device)
        position_ids = self._mask.sum(dim=1, keepdim=True)
        mask = torch.cat(
            [self._mask, torch.ones(batch, 1, dtype=self._mask.dtype, device=self.device)], dim=1
        )
        logits, cache = self._forward(
            input_ids, cache_from_kv(self._kv), attention_mask=mask, position_ids=position_ids
        )
        kv = plain_kv(cache)
        assert kv is not None
        self._kv, self._mask = kv, mask
        self._advance(self._active, logits)
        self._drop([s for s in self._active if s.done or s.cancelled])

    def _advance(self, seqs: list[_Seq], logits: torch.Tensor) -> None:
        """Sample the next token of each sequence (row i of ``logits``) and emit it."""
        reqs = [s.request for s in seqs]
        tokens, logprobs = sample_rows(
            logits, [r.temperature for r in reqs], [r.top_p for r in reqs], [s.generator for s in seqs]
        )
        k = max(r.top_logprobs for r in reqs)
        tops = top_rows(logits, k) if k > 0 else [None] * len(seqs)
        for seq, token, logprob, top in zip(seqs, tokens, logprobs, tops, strict=True):
            seq.n_generated += 1
            seq.last_token = token
            seq.sampled.append(token)
            finish: FinishReason | None = None
            if token in seq.stops:
                finish = "stop"
            elif seq.n_generated >= seq.max_tokens:
                finish = "length"
            seq.done = finish is not None
            want = seq.request.top_logprobs
            event = TokenEvent(token, logprob, finish, self.policy_version,
                               top[:want] if top is not None and want else None)
            self._emit(seq, event)

    def _merge(self, joining: list[tuple[_Seq, list[tuple[torch.Tensor, torch.Tensor]]]]) -> None:
        """Add prefilled sequences (KV of shape (1, H, P, D) each) to the cohort in one concatenation,
        left-padding every part to the longest."""
        parts_kv = ([] if self._kv is None else [self._kv]) + [kv for _, kv in joining]
        parts_mask = [] if self._mask is None else [self._mask]
        parts_mask += [
            torch.ones(1, kv[0][0].shape[2], dtype=torch.long, device=self.device) for _, kv in joining
        ]
        width = max(m.shape[1] for m in parts_mask)
        self._kv = [
            (
                torch.cat([left_pad(p[layer][0], width) for p in parts_kv], dim=0),
                torch.cat([left_pad(p[layer][1], width) for p in parts_kv], dim=0),
            )
            for layer in range(len(parts_kv[0]))
        ]
        self._mask = torch.cat([left_pad(m, width) for m in parts_mask], dim=0)
        self._active += [seq for seq, _ in joining]

    def _drop(self, leaving: list[_Seq]) -> None:
        if not leaving:
            return
        gone = {id(s) for s in leaving}
        assert self._kv is not None and self._mask is not None
        for row, s in enumerate(self._active):
            if id(s) in gone and s.done and s.request.session_id is not None:
                real = self._mask[row].bool()  # keys/values cover the prompt and all but the last sampled id
                kv = [(k[row : row + 1][:, :, real], v[row : row + 1][:, :, real]) for k, v in self._kv]
                self.prefix_cache.put(
                    s.request.session_id, PrefixEntry(s.request.prompt_ids + s.sampled[:-1], kv)
                )
        keep = [i for i, s in enumerate(self._active) if id(s) not in gone]
        self._active = [self._active[i] for i in keep]
        if not keep:
            self._kv, self._mask = None, None
            return
        assert self._kv is not None and self._mask is not None
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self._mask.index_select(0, idx)
        start = int((mask.sum(dim=0) > 0).nonzero()[0])  # trim columns that are padding in every row
        self._mask = mask[:, start:]
        self._kv = [
            (k.index_select(0, idx)[:, :, start:], v.index_select(0, idx)[:, :, start:]) for k, v in self._kv
        ]

    def _abort_all(self) -> None:
        for seq in [*self._active, *self._solo]:
            self._emit(seq, TokenEvent(None, None, "abort", self.policy_version))
        self._active, self._solo, self._kv, self._mask = [], [], None, None

    def _swap_weights(self, state_dict: Mapping[str, Any], version: int, keep_in_flight: bool = False) -> None:
        """Between two steps (the step lock): the new weights; the sequences under way are aborted, or with
        ``keep_in_flight`` queued first to be prefilled again (prompt + sampled) under the new weights."""
        with self._between_steps():
            load_weights(self.model, state_dict)
            if keep_in_flight:
                resumed = [s for s in [*self._active, *self._solo] if not (s.done or s.cancelled)]
                for seq in resumed:
                    seq.cache = None
                self._active, self._solo, self._kv, self._mask = [], [], None, None
                with self._cv:
                    self._pending.extendleft(reversed(resumed))
            else:
                self._abort_all()
            self.prefix_cache.clear()  # cached keys/values belong to the old weights
            self.policy_version = version

    @staticmethod
    def _emit(seq: _Seq, item: Any) -> None:
        try:
            seq.loop.call_soon_threadsafe(seq.queue.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is gone
            seq.cancelled = True


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = getattr(out, "past_key_values", None)  # transformers 4.x
    if cache is None:
        raise EngineError("the model returned no KV cache; it cannot be served by the embedded engine")
    return cache


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (eos if isinstance(eos, list) else [eos]) + [tokenizer.eos_token_id]:
        if isinstance(value, int) and value >= 0 and value not in ids:
            ids.append(value)
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id and tid not in ids:
            ids.append(tid)
    return ids
