"""Stand-in vLLM and SGLang servers, for tests and benchmarks on machines without a GPU.

vLLM and SGLang cannot run here, so these small Starlette apps serve the parts of their documented HTTP
APIs that polar uses, with the same request fields, response fields, SSE framing and error shapes:

- vLLM OpenAI-compatible server: ``POST /v1/completions`` (token-id ``prompt``, ``max_tokens``,
  ``temperature``, ``top_p``, ``seed``, ``stop_token_ids``, ``logprobs``, ``return_token_ids``,
  ``return_tokens_as_token_ids``, ``stream``), ``GET /v1/models`` (with ``max_model_len``), ``GET /health``.
  Choices carry ``token_ids`` and (first chunk only when streaming) ``prompt_token_ids``; errors are
  ``{"error": {"message", "type", "param", "code"}}``. With ``VLLM_SERVER_DEV_MODE=1`` vLLM 0.32 also
  serves the RL routes weight sync uses, imitated here: ``POST /pause?mode=abort|wait|keep``,
  ``POST /resume``, ``GET /is_paused``, ``POST /collective_rpc`` (only ``reload_weights`` with
  ``kwargs.weights_path``), ``POST /update_weight_version`` ``{"new_version"}``, ``GET /weight_info``
  (``"default"`` until set) and ``POST /abort_requests``.
- SGLang native server: ``POST /generate`` (``input_ids``, ``sampling_params`` with ``max_new_tokens``,
  ``temperature``, ``top_p``, ``stop_token_ids``, ``sampling_seed``; ``return_logprob``, ``stream``),
  ``GET /get_model_info``, ``GET /health``. Streams are cumulative like SGLang's default, or
  incremental like ``--incremental-streaming-output``; ``meta_info.output_token_logprobs`` holds
  ``[logprob, token_id, null]`` triples and ``finish_reason`` is ``{"type": ..., ...}``. Weight updates
  as SGLang documents them: ``POST /pause_generation`` ``{"mode": "abort"|"retract"|"in_place"}``,
  ``POST /update_weights_from_disk`` ``{"model_path", "load_format", "abort_all_requests",
  "weight_version", "flush_cache", ...}`` answering ``{"success", "message", "num_paused_requests"}``
  (HTTP 400 with ``success: false`` when it fails), ``POST /continue_generation``, ``GET /model_info``
  (with ``weight_version``, ``"default"`` until set) and ``POST /abort_request`` ``{"rid"|"abort_all"}``.

Paused (either API), a stand-in holds new generation requests until it is resumed, as the real servers
do; a weight load reads the folder's ``*.safetensors`` into the engine (:meth:`Engine.update_weights`).

Tokens come from any polar :class:`Engine`: the embedded tiny model (real ids and logprobs, for
faithfulness tests) or :class:`FixedEngine` (instant fixed tokens, for overhead benchmarks).
Run one in its own process with ``python -m polar.testing.standin --api vllm --port 8001``.
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse as _StarletteJSONResponse
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from polar.httpserver import ThreadedUvicorn, bind, uvicorn_config
from polar.inference.base import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    FinishReason,
    GenerationRequest,
    TokenEvent,
)

log = logging.getLogger(__name__)


class FixedEngine(Engine):
    """Returns ``n_tokens`` fixed ids at once (logprob ``-0.5`` each): a zero-cost upstream for benchmarks."""

    def __init__(
        self, n_tokens: int = 16, token_ids: list[int] | None = None, context_length: int = 32768
    ) -> None:
        self.tokenizer = None  # type: ignore[assignment]
        self.model_name = "fixed"
        self.context_length = context_length
        self.policy_version = 0
        self.default_stop_token_ids = []
        self.n_tokens = n_tokens
        self.token_ids = token_ids or [100 + (i % 50) for i in range(n_tokens)]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        request.validate()
        if len(request.prompt_ids) >= self.context_length:
            raise ContextLengthExceeded(len(request.prompt_ids), self.context_length)
        n = min(self.n_tokens, request.max_tokens, self.context_length - len(request.prompt_ids))
        ids = self.token_ids[:n]
        stops = set(request.stop_token_ids)
        for i, tid in enumerate(ids):
            finish: FinishReason | None = "stop" if tid in stops else ("length" if i == len(ids) - 1 else None)
            yield TokenEvent(tid, -0.5, finish, self.policy_version if finish else None)
            if finish:
                return


class JSONResponse(_StarletteJSONResponse):
    """orjson-rendered, as the real servers' own fast paths are: the stand-in should cost little."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


async def _json_body(request: Request) -> Any:
    return orjson.loads(await request.body())


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


_DONE = b"data: [DONE]\n\n"


class _Standin:
    """State shared by both APIs: the engine, the served name, and a log of requests for assertions."""

    def __init__(self, engine: Engine, served_model: str, max_model_len: int | None, name: str) -> None:
        self.engine = engine
        self.served_model = served_model
        self.max_model_len = max_model_len or engine.context_length
        self.name = name
        self.requests: list[dict[str, Any]] = []
        self.health_calls = 0
        self.weight_version = "default"
        self.control: list[str] = []  # the weight-sync calls received, in order (e.g. "POST /pause")
        self.loads = 0  # successful weight loads
        self._resumed: Any = None  # asyncio.Event, made on the server's loop

    def _gate(self) -> Any:
        import asyncio

        if self._resumed is None:
            self._resumed = asyncio.Event()
            self._resumed.set()
        return self._resumed

    async def _wait_resumed(self) -> None:
        await self._gate().wait()

    async def _load(self, folder: str) -> str | None:
        """Read ``folder``'s safetensors into the engine; the reason it failed, or None."""
        import asyncio
        from pathlib import Path

        files = sorted(Path(folder).glob("*.safetensors")) if folder else []
        if not files:
            return f"no *.safetensors weights in {folder!r}"
        try:
            from safetensors.torch import load_file

            state: dict[str, Any] = {}
            for f in files:
                state.update(await asyncio.to_thread(load_file, str(f)))
            await self.engine.update_weights(state, self.engine.policy_version)
        except Exception as exc:  # the real servers report the loader's error
            return f"{type(exc).__name__}: {exc}"
        self.loads += 1
        return None

    def text(self, ids: list[int]) -> str:
        tok = self.engine.tokenizer
        return tok.decode(ids, skip_special_tokens=False) if tok is not None and ids else ""

    async def health(self, request: Request) -> Response:
        self.health_calls += 1
        return Response(status_code=200)

    # ------------------------------------------------------------------ vLLM
    async def vllm_models(self, request: Request) -> Response:
        card = {
            "id": self.served_model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.served_model,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @staticmethod
    def vllm_error(
        message: str, status: int = 400, kind: str = "BadRequestError", param: str | None = None
    ) -> Response:
        return JSONResponse(
            {"error": {"message": message, "type": kind, "param": param, "code": status}}, status
        )

    # ---- vLLM dev-mode RL routes (vllm/entrypoints/rl/online/api_router.py, 0.32)
    async def _pause(self, route: str, mode: str) -> None:
        """Both APIs' pause: in-flight requests aborted in ``abort`` mode; new ones held until the resume."""
        self.control.append(route)
        if mode == "abort":
            await self.engine.abort_inflight()
        self._gate().clear()

    def _resume(self, route: str) -> None:
        self.control.append(route)
        self._gate().set()

    async def vllm_pause(self, request: Request) -> Response:
        mode = request.query_params.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            self.control.append("POST /pause")
            return JSONResponse({"error": f"Invalid pause mode: {mode}"}, 400)
        await self._pause("POST /pause", mode)
        return JSONResponse({"status": "paused"})

    async def vllm_resume(self, request: Request) -> Response:
        self._resume("POST /resume")
        return JSONResponse({"status": "resumed"})

    async def vllm_is_paused(self, request: Request) -> Response:
        return JSONResponse({"is_paused": not self._gate().is_set()})

    async def vllm_collective_rpc(self, request: Request) -> Response:
        self.control.append("POST /collective_rpc")
        try:
            body = await _json_body(request)
        except ValueError as exc:
            return JSONResponse({"detail": f"JSON decode error: {exc}"}, 400)
        if not isinstance(body, dict) or body.get("method") is None:
            return JSONResponse({"detail": "Missing 'method' in request body"}, 400)
        if body["method"] != "reload_weights":
            return JSONResponse({"detail": f"this stand-in serves only reload_weights, not {body['method']!r}"}, 400)
        error = await self._load(str((body.get("kwargs") or {}).get("weights_path") or ""))
        if error is not None:  # vLLM: the worker's exception surfaces as a 500
            return Response("Internal Server Error", 500, media_type="text/plain")
        return JSONResponse({"results": [None]})

    async def vllm_update_weight_version(self, request: Request) -> Response:
        self.control.append("POST /update_weight_version")
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("new_version"), str):
            return JSONResponse({"detail": [{"loc": ["body", "new_version"], "msg": "Field required"}]}, 422)
        self.weight_version = body["new_version"]
        return JSONResponse({"success": True, "new_version": self.weight_version})

    async def vllm_weight_info(self, request: Request) -> Response:
        return JSONResponse({"weight_version": self.weight_version})

    async def vllm_abort_requests(self, request: Request) -> Response:
        self.control.append("POST /abort_requests")
        n = await self.engine.abort_inflight()
        return JSONResponse({"status": "aborted", "aborted": n})

    async def vllm_completions(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
        except ValueError:
            return self.vllm_error("request body is not valid JSON")
        await self._wait_resumed()
        self.requests.append({"api": "vllm", "replica": self.name, "body": body})
        if body.get("model") != self.served_model:
            return self.vllm_error(
                f"The model `{body.get('model')}` does not exist.", 404, "NotFoundError", "model"
            )
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return self.vllm_error(
                "this stand-in accepts only token-id prompts (a list of ints)", param="prompt"
            )
        max_tokens = int(body.get("max_tokens") or 16)
        if len(prompt) + max_tokens > self.max_model_len:
            return self.vllm_error(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion.",
                param="prompt",
            )
        gen = GenerationRequest(
            prompt_ids=prompt,
            max_tokens=max_tokens,
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            stop_token_ids=list(body.get("stop_token_ids") or []),
            seed=body.get("seed"),
        )
        try:
            gen.validate()
        except EngineError as exc:
            return self.vllm_error(str(exc))
        want_ids = bool(body.get("return_token_ids"))
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        want_lp = body.get("logprobs") is not None
        cid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())

        def choice(ids: list[int], lps: list[float], finish: str | None, first: bool) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "text": self.text(ids)}
            if want_lp:
                tokens = [f"token_id:{t}" if as_ids else self.text([t]) for t in ids]
                c["logprobs"] = {
                    "text_offset": list(range(len(ids))),
                    "token_logprobs": lps,
                    "tokens": tokens,
                    "top_logprobs": [{tk: lp} for tk, lp in zip(tokens, lps, strict=False)],
                }
            else:
                c["logprobs"] = None
            c["finish_reason"] = finish
            c["stop_reason"] = ids[-1] if finish == "stop" and ids and ids[-1] in gen.stop_token_ids else None
            if want_ids:
                c["token_ids"] = ids
                if first:
                    c["prompt_token_ids"] = prompt
            c["prompt_logprobs"] = None
            return c

        def envelope(c: dict[str, Any], usage: dict[str, int] | None) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": self.served_model,
                "choices": [c],
                "usage": usage,
            }

        if body.get("stream"):

            async def chunks() -> AsyncIterator[bytes]:
                first = True
                async for ev in self.engine.generate(gen):
                    ids = [ev.token_id] if ev.token_id is not None else []
                    lps: list[Any] = [ev.logprob] if ev.token_id is not None else []
                    yield _sse(envelope(choice(ids, lps, ev.finish_reason, first), None))
                    first = False
                yield _DONE

            return StreamingResponse(chunks(), media_type="text/event-stream")

        ids, lps, finish = await _drain(self.engine, gen)
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }
        return JSONResponse(envelope(choice(ids, lps, finish, True), usage))

    # ------------------------------------------------------------------ SGLang
    async def sglang_model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": self.served_model, "tokenizer_path": self.served_model,
                             "is_generation": True, "weight_version": self.weight_version})

    # ---- SGLang weight updates (sglang/srt/entrypoints/http_server.py, managers/io_struct.py)
    async def sglang_pause(self, request: Request) -> Response:
        raw = await request.body()
        body = orjson.loads(raw) if raw.strip() else {}
        mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
        if mode not in ("abort", "retract", "in_place"):
            self.control.append("POST /pause_generation")
            return JSONResponse({"object": "error", "message": f"Invalid mode: {mode!r}. Expected one of "
                                 "['abort', 'retract', 'in_place'].", "type": "Bad Request", "code": 400}, 400)
        await self._pause("POST /pause_generation", mode)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    async def sglang_continue(self, request: Request) -> Response:
        self._resume("POST /continue_generation")
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def sglang_update_from_disk(self, request: Request) -> Response:
        self.control.append("POST /update_weights_from_disk")
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            return JSONResponse({"object": "error", "message": "model_path: Field required", "type": "Bad Request",
                                 "code": 400}, 400)
        if body.get("abort_all_requests"):
            await self.engine.abort_inflight()
        error = await self._load(body["model_path"])
        if error is not None:
            return JSONResponse({"success": False, "message": f"Failed to update weights: {error}. Rolling back to "
                                 "original weights.", "num_paused_requests": 0}, 400)
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
            message += f" Weight version updated to {self.weight_version}."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    async def sglang_abort(self, request: Request) -> Response:
        self.control.append("POST /abort_request")
        await self.engine.abort_inflight()
        return Response(status_code=200)

    async def sglang_generate(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
        except ValueError:
            return JSONResponse({"error": {"message": "request body is not valid JSON"}}, 400)
        await self._wait_resumed()
        self.requests.append({"api": "sglang", "replica": self.name, "body": body})
        input_ids = body.get("input_ids")
        if not (isinstance(input_ids, list) and input_ids and all(isinstance(t, int) for t in input_ids)):
            return JSONResponse(
                {"error": {"message": "this stand-in accepts only a single input_ids list"}}, 400
            )
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        if len(input_ids) >= self.max_model_len:
            return JSONResponse(
                {
                    "error": {
                        "message": f"The input ({len(input_ids)} tokens) is longer than the model's context "
                        f"length ({self.max_model_len} tokens)."
                    }
                },
                400,
            )
        gen = GenerationRequest(
            prompt_ids=input_ids,
            max_tokens=max(1, min(max_new, self.max_model_len - len(input_ids))),
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            stop_token_ids=list(sp.get("stop_token_ids") or []),
            seed=sp.get("sampling_seed"),
        )
        want_lp = bool(body.get("return_logprob"))
        rid = uuid.uuid4().hex

        def out(ids: list[int], lps: list[float], finish: str | None, total: int) -> dict[str, Any]:
            reason: dict[str, Any] | None = None
            if finish == "stop":
                reason = {"type": "stop", "matched": ids[-1] if ids else None}
            elif finish == "length":
                reason = {"type": "length", "length": total}
            elif finish == "abort":
                reason = {"type": "abort", "message": "aborted"}
            meta: dict[str, Any] = {
                "id": rid,
                "finish_reason": reason,
                "prompt_tokens": len(input_ids),
                "completion_tokens": total,
                "cached_tokens": 0,
            }
            if want_lp:
                meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(ids, lps, strict=False)]
            return {"text": self.text(ids), "output_ids": ids, "meta_info": meta}

        if body.get("stream"):
            incremental = self.incremental

            async def chunks() -> AsyncIterator[bytes]:
                ids: list[int] = []
                lps: list[float] = []
                async for ev in self.engine.generate(gen):
                    new = [ev.token_id] if ev.token_id is not None else []
                    new_lp = [float(ev.logprob or 0.0)] if new else []
                    ids += new
                    lps += new_lp
                    if incremental:
                        yield _sse(out(new, new_lp, ev.finish_reason, len(ids)))
                    else:
                        yield _sse(out(ids, lps, ev.finish_reason, len(ids)))
                yield _DONE

            return StreamingResponse(chunks(), media_type="text/event-stream")

        ids, lps, finish = await _drain(self.engine, gen)
        return JSONResponse(out(ids, lps, finish, len(ids)))

    incremental = False


async def _drain(engine: Engine, gen: GenerationRequest) -> tuple[list[int], list[float], str]:
    ids: list[int] = []
    lps: list[float] = []
    finish = "abort"
    async for ev in engine.generate(gen):
        if ev.token_id is not None:
            ids.append(ev.token_id)
            lps.append(float(ev.logprob or 0.0))
        if ev.finish_reason:
            finish = ev.finish_reason
    return ids, lps, finish


def make_app(
    engine: Engine,
    api: str = "vllm",
    *,
    served_model: str = "tiny",
    max_model_len: int | None = None,
    name: str = "standin",
    incremental: bool = False,
) -> Starlette:
    """A Starlette app speaking the vLLM (``api="vllm"``) or SGLang (``api="sglang"``) HTTP API."""
    state = _Standin(engine, served_model, max_model_len, name)
    state.incremental = incremental
    if api == "vllm":
        routes = [
            Route("/v1/completions", state.vllm_completions, methods=["POST"]),
            Route("/v1/models", state.vllm_models, methods=["GET"]),
            Route("/health", state.health, methods=["GET"]),
            Route("/pause", state.vllm_pause, methods=["POST"]),
            Route("/resume", state.vllm_resume, methods=["POST"]),
            Route("/is_paused", state.vllm_is_paused, methods=["GET"]),
            Route("/collective_rpc", state.vllm_collective_rpc, methods=["POST"]),
            Route("/update_weight_version", state.vllm_update_weight_version, methods=["POST"]),
            Route("/weight_info", state.vllm_weight_info, methods=["GET"]),
            Route("/abort_requests", state.vllm_abort_requests, methods=["POST"]),
        ]
    elif api == "sglang":
        routes = [
            Route("/generate", state.sglang_generate, methods=["POST"]),
            Route("/get_model_info", state.sglang_model_info, methods=["GET"]),
            Route("/model_info", state.sglang_model_info, methods=["GET"]),
            Route("/health", state.health, methods=["GET"]),
            Route("/pause_generation", state.sglang_pause, methods=["POST"]),
            Route("/continue_generation", state.sglang_continue, methods=["POST"]),
            Route("/update_weights_from_disk", state.sglang_update_from_disk, methods=["POST"]),
            Route("/abort_request", state.sglang_abort, methods=["POST"]),
        ]
    else:
        raise EngineError(f"unknown stand-in api '{api}'; use 'vllm' or 'sglang'")
    app = Starlette(routes=routes)
    app.state.standin = state
    return app


class StandinServer:
    """Run an ASGI app with uvicorn on 127.0.0.1 in a background thread (``with StandinServer(app) as s:``)."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 20.0
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._start_timeout_s = start_timeout_s
        self._uv: ThreadedUvicorn | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.app.state.standin.requests

    def start(self) -> StandinServer:
        try:
            sock = bind(self.host, self.port)
        except OSError as e:
            raise EngineError(f"stand-in server cannot listen on {self.host}:{self.port}: {e}") from None
        self.port = sock.getsockname()[1]
        self._uv = ThreadedUvicorn(uvicorn_config(self.app, server_name="stand-in server", log_config=None), sock,
                                   "polar-standin")
        if not self._uv.start(self._start_timeout_s):
            self._uv.stop()
            raise EngineError(f"stand-in server did not start on {self.host}:{self.port}")
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._uv is not None:
            self._uv.stop(timeout_s)
            self._uv = None

    def __enter__(self) -> StandinServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m polar.testing.standin --api vllm --port 8001 [--engine fixed|tiny] [--tokens 16]``."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=["vllm", "sglang"], default="vllm")
    parser.add_argument("--engine", choices=["fixed", "tiny"], default="fixed")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per completion (fixed engine)")
    parser.add_argument("--served-model", default="tiny")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--incremental", action="store_true", help="SGLang incremental streaming")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if args.engine == "fixed":
        engine: Engine = FixedEngine(args.tokens)
    else:
        from polar.inference.embedded import EmbeddedEngine

        engine = EmbeddedEngine.from_spec("tiny")
    app = make_app(engine, args.api, served_model=args.served_model, incremental=args.incremental)
    uvicorn.Server(uvicorn_config(app, server_name="stand-in server", host=args.host, port=args.port)).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
