"""Rollout as a service: submit a task with ``num_samples`` (one GRPO group), poll or get a callback,
list and cancel tasks, follow an SSE event stream, and see per-stage load at ``/health``. Gateway nodes
register and heartbeat here; each new session goes to the least-loaded healthy node, and a session whose
node is lost mid-flight is re-dispatched to another (``/health`` counts ``sessions_redispatched``).

``RolloutService`` is the in-process API (coroutines on one loop); ``build_app`` wraps it in HTTP:

=========================================  =================================================
``POST /tasks``                            ``{task, num_samples, metadata, task_id?, callback_url?}``
``GET /tasks?status=``                     list (no samples)
``GET /tasks/{id}?wait_s=&samples=1``      one task; ``wait_s`` long-polls until it is done
``DELETE /tasks/{id}``                     cancel every session of the task
``GET /events?max_events=``                SSE: ``task``, ``session`` and ``redispatch`` events
``GET /health``                            per-stage load, nodes, task counts
``POST /nodes/register``                   ``{node_id, url, capacity?, admin_token?}``
``POST /nodes/{id}/heartbeat``             body = the node's load report
``GET /nodes``, ``DELETE /nodes/{id}``
=========================================  =================================================

Every route but ``GET /health`` needs ``Authorization: Bearer <service token>``: a random token the run
keeps in memory (``RolloutServer.token``) and hands only to polar's own clients (the local stack, gateway
nodes through their Ray actor arguments), never to a harness. Without it an agent program on the host that
finds the port could list tasks and their answers, cancel siblings, or register a gateway node of its own
(forged records, tokens and logprobs). ``/health`` without the token leaves out the nodes' addresses.
Requests with a foreign ``Host`` or a state-changing cross-site ``Origin`` get 403 (as the gateway's).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from polar.gateway.app import LOOPBACK_NAMES, HostOriginGuard
from polar.httpserver import BodyError, read_body
from polar.rollout.sessions.nodes import NodeRegistry
from polar.rollout.sessions.pipeline import SessionPipeline
from polar.rollout.sessions.session import SessionResult, SessionSpec, SessionStatus

log = logging.getLogger(__name__)

MAX_NUM_SAMPLES = 1024


@dataclass
class TaskState:
    task_id: str
    task: dict[str, Any]
    num_samples: int
    metadata: dict[str, Any]
    callback_url: str | None = None
    status: str = "running"  # running | done | cancelled
    session_ids: list[str] = field(default_factory=list)
    results: list[SessionResult] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def to_dict(self, with_samples: bool = False) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
        return {
            "task_id": self.task_id, "status": self.status, "num_samples": self.num_samples,
            "completed_sessions": len(self.results), "session_ids": self.session_ids, "status_counts": counts,
            "metadata": self.metadata, "created_at": self.created_at,
            "results": [r.to_dict(with_samples=with_samples) for r in self.results],
        }


class RolloutService:
    """Fans tasks out into sessions on a :class:`SessionPipeline`. Use from the loop that owns the pipeline."""

    def __init__(self, pipeline: SessionPipeline, registry: NodeRegistry, max_tasks_kept: int = 10_000) -> None:
        self.pipeline = pipeline
        self.registry = registry
        self.tasks: dict[str, TaskState] = {}
        self.max_tasks_kept = max_tasks_kept
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._background: set[asyncio.Task[None]] = set()
        prev = pipeline.on_event

        def on_event(event: dict[str, Any]) -> None:
            if prev is not None:
                prev(event)
            self.publish(event)

        pipeline.on_event = on_event

    def publish(self, event: dict[str, Any]) -> None:
        event = {"time": time.time(), **event}
        for q in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(event)

    def subscribe(self, maxsize: int = 10_000) -> asyncio.Queue[dict[str, Any]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(q)

    async def submit(self, task: dict[str, Any], num_samples: int = 1, metadata: dict[str, Any] | None = None,
                     task_id: str | None = None, callback_url: str | None = None) -> str:
        if not isinstance(task, dict):
            raise ValueError(f"'task' must be a JSON object, got {type(task).__name__}")
        if not (1 <= int(num_samples) <= MAX_NUM_SAMPLES):
            raise ValueError(f"'num_samples' must be between 1 and {MAX_NUM_SAMPLES} (got {num_samples})")
        task_id = task_id or str(task.get("id") or "t") + "-" + uuid.uuid4().hex[:8]
        if task_id in self.tasks:
            raise KeyError(f"task {task_id!r} already exists")
        self._trim()
        state = TaskState(task_id, task, int(num_samples), dict(metadata or {}), callback_url)
        self.tasks[task_id] = state
        group_id = str(state.metadata.get("group_id") or task_id)
        jobs = []
        for i in range(state.num_samples):
            sid = f"ses-{uuid.uuid4().hex[:16]}"
            state.session_ids.append(sid)
            spec = SessionSpec(sid, task, task_id=task_id, group_id=group_id, sample_index=i, metadata=dict(state.metadata))
            jobs.append(self.pipeline.submit(spec))
        self.publish({"type": "task", "task_id": task_id, "status": "running", "num_samples": state.num_samples})
        collecting = asyncio.ensure_future(self._collect(state, jobs))
        self._background.add(collecting)
        collecting.add_done_callback(self._background.discard)
        return task_id

    async def _collect(self, state: TaskState, jobs: list[asyncio.Task[SessionResult]]) -> None:
        for fut in asyncio.as_completed(jobs):
            try:
                state.results.append(await fut)
            except Exception as e:  # the pipeline turns failures into results; this is a last resort
                log.exception("session of task %s crashed", state.task_id)
                state.results.append(SessionResult("?", state.task_id, None, -1, SessionStatus.ERROR, error=str(e)))
        state.results.sort(key=lambda r: r.sample_index)
        if state.status == "running":
            state.status = "done"
        state.done.set()
        self.publish({"type": "task", "task_id": state.task_id, "status": state.status,
                      "rewards": [r.reward for r in state.results]})
        if state.callback_url:
            await self._callback(state)

    async def _callback(self, state: TaskState) -> None:
        body = state.to_dict(with_samples=True)
        async with httpx.AsyncClient(timeout=30.0) as http:
            for attempt in range(3):
                try:
                    resp = await http.post(state.callback_url, json=body)
                    if resp.status_code < 500:
                        return
                except httpx.HTTPError as e:
                    log.warning("callback to %s failed (attempt %d): %s", state.callback_url, attempt + 1, e)
                await asyncio.sleep(0.5 * (attempt + 1))

    def _trim(self) -> None:
        if len(self.tasks) < self.max_tasks_kept:
            return
        for tid in [t for t, s in self.tasks.items() if s.status != "running"][: len(self.tasks) // 10 + 1]:
            del self.tasks[tid]

    def get(self, task_id: str) -> TaskState:
        if task_id not in self.tasks:
            raise KeyError(f"unknown task {task_id!r}")
        return self.tasks[task_id]

    async def wait(self, task_id: str, timeout_s: float | None = None) -> TaskState:
        state = self.get(task_id)
        await asyncio.wait_for(state.done.wait(), timeout_s)
        return state

    async def cancel(self, task_id: str) -> TaskState:
        state = self.get(task_id)
        if state.status == "running":
            state.status = "cancelled"
            for sid in state.session_ids:
                self.pipeline.cancel(sid)
        return state

    def list(self, status: str | None = None) -> list[TaskState]:
        return [s for s in self.tasks.values() if status is None or s.status == status]

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok" if any(self.registry.healthy(n) for n in self.registry.nodes.values()) else "no_healthy_nodes",
            "stages": self.pipeline.load(),
            "nodes": self.registry.describe(),
            "sessions_redispatched": self.pipeline.sessions_redispatched,
            "sessions_node_lost": self.pipeline.sessions_node_lost,
            "tasks": {s: sum(1 for t in self.tasks.values() if t.status == s) for s in ("running", "done", "cancelled")},
        }


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status)


MAX_BODY_BYTES = 16 << 20  # a task or a node report; a body past it is cut while it streams (413)
BODY_TIMEOUT_S = 30.0  # from the headers to the body's last byte (408 after)


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, read through ``read_body``: refused (``BodyError``) as soon as it passes
    ``MAX_BODY_BYTES``, never read whole first."""
    raw = await read_body(request.stream(), request.headers.get("content-length"), MAX_BODY_BYTES, BODY_TIMEOUT_S)
    try:
        body = json.loads(raw or b"{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    return body


def service_headers(token: str) -> dict[str, str]:
    """The header every polar client of the rollout service sends."""
    return {"authorization": f"Bearer {token}"}


def _authorized(request: Request, token: str) -> bool:
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    # constant time: a prober learns nothing from how long a wrong token takes to refuse
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


class _ServiceAuth:
    """ASGI wrapper: every route but ``GET /health`` needs the service token (401 otherwise)."""

    def __init__(self, app: Starlette, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") != "/health":
            if not _authorized(Request(scope), self.token):
                await _error(401, "the rollout service needs its run's token (Authorization: Bearer ...); "
                                  "only polar's own clients hold it")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(service: RolloutService, token: str, host: str = "127.0.0.1") -> HostOriginGuard:
    """The HTTP app; ``token`` (required, random per run) guards every route but ``/health``."""
    if len(token) < 16:
        raise ValueError("the rollout service token must be a random string of at least 16 characters "
                         "(secrets.token_urlsafe(32))")
    async def submit(request: Request) -> JSONResponse:
        try:
            body = await _json_body(request)
            unknown = set(body) - {"task", "num_samples", "metadata", "task_id", "callback_url"}
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}; allowed: task, num_samples, metadata, task_id, callback_url")
            if "task" not in body:
                raise ValueError("missing 'task' (a JSON object with at least a 'prompt')")
            tid = await service.submit(body["task"], body.get("num_samples", 1), body.get("metadata"),
                                       body.get("task_id"), body.get("callback_url"))
        except BodyError as e:
            return _error(e.status, str(e))
        except KeyError as e:
            return _error(409, str(e.args[0]))
        except (ValueError, TypeError) as e:
            return _error(400, str(e))
        return JSONResponse({"task_id": tid, "status": "running"})

    async def list_tasks(request: Request) -> JSONResponse:
        status = request.query_params.get("status")
        return JSONResponse({"tasks": [s.to_dict() for s in service.list(status)]})

    async def get_task(request: Request) -> JSONResponse:
        tid = request.path_params["task_id"]
        try:
            wait_s = min(float(request.query_params.get("wait_s", 0)), 600.0)
            state = service.get(tid)
            if wait_s > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await service.wait(tid, wait_s)
        except KeyError as e:
            return _error(404, str(e.args[0]))
        except ValueError:
            return _error(400, "wait_s must be a number")
        return JSONResponse(state.to_dict(with_samples=request.query_params.get("samples", "1") != "0"))

    async def cancel_task(request: Request) -> JSONResponse:
        try:
            state = await service.cancel(request.path_params["task_id"])
        except KeyError as e:
            return _error(404, str(e.args[0]))
        return JSONResponse({"task_id": state.task_id, "status": state.status})

    async def events(request: Request) -> StreamingResponse:
        max_events = int(request.query_params.get("max_events", 0) or 0)
        q = service.subscribe()

        async def stream() -> AsyncIterator[bytes]:
            sent = 0
            try:
                yield b": polar rollout events\n\n"
                while not max_events or sent < max_events:
                    try:
                        ev = await asyncio.wait_for(q.get(), timeout=15.0)
                    except asyncio.TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    yield f"event: {ev.get('type', 'message')}\ndata: {json.dumps(ev, default=str)}\n\n".encode()
                    sent += 1
            finally:
                service.unsubscribe(q)

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    async def health(request: Request) -> JSONResponse:
        out = service.health()
        if not _authorized(request, token):  # open to probes: counts and stages, no node addresses
            out["nodes"] = [{k: v for k, v in n.items() if k != "url"} for n in out["nodes"]]
        return JSONResponse(out)

    async def register(request: Request) -> JSONResponse:
        try:
            body = await _json_body(request)
            token = body.get("admin_token")
            node = service.registry.register(str(body["node_id"]), str(body["url"]), capacity=int(body.get("capacity", 0)),
                                             admin_token=str(token) if token else None)
        except BodyError as e:
            return _error(e.status, str(e))
        except KeyError as e:
            return _error(400, f"missing field {e.args[0]!r}; send node_id and url")
        except Exception as e:
            return _error(400, str(e))
        return JSONResponse(node.describe())

    async def heartbeat(request: Request) -> JSONResponse:
        try:
            node = service.registry.heartbeat(request.path_params["node_id"], await _json_body(request))
        except BodyError as e:
            return _error(e.status, str(e))
        except KeyError:
            return _error(404, f"unknown node {request.path_params['node_id']!r}; register it first")
        except ValueError as e:
            return _error(400, str(e))
        return JSONResponse(node.describe())

    async def nodes(request: Request) -> JSONResponse:
        return JSONResponse({"nodes": service.registry.describe()})

    async def remove_node(request: Request) -> JSONResponse:
        service.registry.remove(request.path_params["node_id"])
        return JSONResponse({"removed": request.path_params["node_id"]})

    app = Starlette(routes=[
        Route("/tasks", submit, methods=["POST"]),
        Route("/tasks", list_tasks, methods=["GET"]),
        Route("/tasks/{task_id:str}", get_task, methods=["GET"]),
        Route("/tasks/{task_id:str}", cancel_task, methods=["DELETE"]),
        Route("/events", events, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/nodes/register", register, methods=["POST"]),
        Route("/nodes", nodes, methods=["GET"]),
        Route("/nodes/{node_id:str}/heartbeat", heartbeat, methods=["POST"]),
        Route("/nodes/{node_id:str}", remove_node, methods=["DELETE"]),
    ])
    names = {*LOOPBACK_NAMES, host.lower()}
    if host in ("0.0.0.0", "::"):  # all interfaces: nodes on other machines may name this one
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    hosts = frozenset(names)
    return HostOriginGuard(_ServiceAuth(app, token), hosts)
