"""The dashboard's web app: a JSON API over a runs folder, server-sent events, and the static page.

Every request names its run by ``?run=<id>`` (the run folder's path relative to the runs folder). Files are
only ever served from inside the runs folder. A handler that fails answers a JSON error (404 for what does
not exist, 400 for a bad argument, 500 with the cause) and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from polar.config.secrets import redact_yaml_text
from polar.dashboard import ratings
from polar.dashboard.runs import PathError, Run, RunsFolder, safe_path
from polar.httpserver import BodyError, read_body

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
POLL_S = 0.1  # how often watched runs' metrics files are checked for new rows
RUNS_EVERY_S = 1.0  # how often the runs list (statuses) is sent when it changed
MAX_CURVE_POINTS = 5000
RATING_BODY_BYTES = 256 * 1024  # a rating (kind, target, score, a comment of at most 10,000 characters) fits
BODY_TIMEOUT_S = 10.0  # the most a rating's body may take to arrive once its headers have (then 408)
# a file from a run folder is the run's (or its agent's) data: it never renders as a page of this origin
USER_FILE_HEADERS = {"content-security-policy": "default-src 'none'; sandbox", "x-content-type-options": "nosniff",
                     "cache-control": "no-store"}
REDACT_MAX_BYTES = 8 << 20  # YAML/JSON up to this size is parsed and served with its secrets redacted
INLINE_MEDIA = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
                ".webp": "image/webp"}
# the page itself: never framed by another site (clickjacking a rating), no plugins, no foreign <base>
PAGE_CSP = "frame-ancestors 'none'; object-src 'none'; base-uri 'none'"


class FastJSON(JSONResponse):
    """JSON through orjson: a page of curves is thousands of floats."""

    def render(self, content: Any) -> bytes:
        try:
            import orjson

            return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
        except (ImportError, TypeError):
            return super().render(content)


def _points(request: Request) -> int:
    raw = request.query_params.get("n", "1000")
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if not 3 <= n <= MAX_CURVE_POINTS:
        raise ValueError(f"'n' must be an integer from 3 to {MAX_CURVE_POINTS} points (got {raw!r})")
    return n


def _session_summary(row: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """A sessions-table row: the listed fields, the output cut to 200 characters."""
    out = {k: row.get(k) for k in fields}
    text = out.get("output")
    if isinstance(text, str):
        out["output"] = text[:200]
    return out


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _handler(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except KeyError as e:
            return _error(404, f"not found: {e.args[0] if e.args else e}")
        except PathError as e:
            return _error(403, str(e))
        except (ValueError, ratings.RatingError) as e:
            return _error(400, str(e))
        except Exception as e:  # never a dead dashboard: say what broke
            log.exception("dashboard: %s %s failed", request.method, request.url.path)
            return _error(500, f"{type(e).__name__}: {e}")
    return wrapped


class Streams:
    """One poller for every open event stream: reads new metric rows of the runs any page watches, and
    sends each page the rows of the runs it watches."""

    def __init__(self, folder: RunsFolder) -> None:
        self.folder = folder
        self.clients: dict[asyncio.Queue, set[str]] = {}
        self._task: asyncio.Task | None = None
        self._runs_sent = ""
        self._runs_at = 0.0

    def subscribe(self, runs: set[str]) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue(maxsize=1000)
        self.clients[q] = runs
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._poll())
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self.clients.pop(q, None)

    def _send(self, q: asyncio.Queue, event: str, data: Any) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # a page that stopped reading misses events, not the server
            q.put_nowait((event, data))

    async def _poll(self) -> None:
        while self.clients:
            try:
                await self._tick()
            except Exception:
                log.exception("dashboard: polling runs failed")
            await asyncio.sleep(POLL_S)

    async def _tick(self) -> None:
        watched = set().union(*self.clients.values()) if self.clients else set()
        for rid in watched:
            try:
                run = self.folder.get(rid)
            except KeyError:
                continue
            if run.metrics.lock.locked():
                continue  # a first full index is under way in another thread
            points = await asyncio.to_thread(run.metrics.update)
            if points:
                data = {"run": rid, "rows": run.metrics.rows, "skipped": run.metrics.skipped, "points": points,
                        "sent": time.time()}
                for q, runs in list(self.clients.items()):
                    if rid in runs:
                        self._send(q, "metrics", data)
        if time.monotonic() - self._runs_at > RUNS_EVERY_S:
            self._runs_at = time.monotonic()
            infos = await asyncio.to_thread(lambda: [r.info() for r in self.folder.runs().values()])
            text = json.dumps(infos, sort_keys=True, default=str)
            if text != self._runs_sent:
                self._runs_sent = text
                for q in list(self.clients):
                    self._send(q, "runs", infos)


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
COOKIE = "polar_dashboard_token"


def _host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8765`` -> ``::1``, ``localhost:80`` -> ``localhost``)."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def given_token(headers: Mapping[str, str], cookies: Mapping[str, str]) -> str:
    """The token a request carries: ``X-Polar-Token``, ``Authorization: Bearer`` or the login cookie."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return str(auth[7:].strip())
    return str(headers.get("x-polar-token") or cookies.get(COOKIE, ""))


def token_ok(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


class Guard:
    """ASGI middleware in front of every route.

    - ``Host`` must name a loopback address when the dashboard listens on one: a page of another site whose
      name was re-pointed at 127.0.0.1 (DNS rebinding) is refused, so it cannot read the runs.
    - A state-changing request (POST, ...) from a browser must come from the dashboard's own origin (``Origin``
      and ``Sec-Fetch-Site``): another site's page cannot store ratings through the user's browser (CSRF).
    - With ``token_for_reads`` (a non-loopback ``--host``) every ``/api`` and ``/files`` request needs the token
      (header, or the cookie set by opening ``/?token=...`` once)."""

    SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

    def __init__(self, app: Starlette, allowed_hosts: frozenset[str] | None, token: str | None, token_for_reads: bool) -> None:
        self.app = app
        self.state = app.state  # the server and tests read app.state.folder / warm_done
        self.allowed_hosts = allowed_hosts
        self.token = token
        self.token_for_reads = token_for_reads

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self.refusal(request)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, request: Request) -> Response | None:
        host = request.headers.get("host", "")
        if self.allowed_hosts is not None and _host_name(host) not in self.allowed_hosts:
            return _error(403, f"Host {host!r} is not this dashboard's address (it listens on loopback: open it as "
                               "http://127.0.0.1:PORT/); a page of another site cannot read it")
        if request.method not in self.SAFE:
            origin = request.headers.get("origin")
            site = request.headers.get("sec-fetch-site")
            own = {f"http://{host}", f"https://{host}"}
            if (origin is not None and origin not in own) or site in ("cross-site", "same-site"):
                return _error(403, f"cross-origin {request.method} refused: a page of {origin or 'another site'} "
                                   "cannot change this dashboard's data; use the dashboard's own page")
        if self.token is not None and self.token_for_reads:
            path = request.url.path
            if path == "/" and request.query_params.get("token"):
                if not token_ok(request.query_params["token"], self.token):
                    return _error(401, "wrong dashboard token in ?token=")
                resp = RedirectResponse("/", status_code=303)
                resp.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
                return resp
            if path.startswith(("/api/", "/files/")) and not token_ok(given_token(request.headers, request.cookies),
                                                                        self.token):
                return _error(401, "this dashboard needs its token: open it once as http://HOST:PORT/?token=TOKEN "
                                   "(the value of $POLAR_DASHBOARD_TOKEN where it runs), or send X-Polar-Token")
        return None


def build_app(root: str | Path, ratings_token: str | None = None, allowed_hosts: frozenset[str] | None = LOOPBACK_NAMES,
              token_for_reads: bool = False) -> Guard:
    """The dashboard's ASGI app over the runs folder ``root``. ``ratings_token``: the token ratings (and, with
    ``token_for_reads``, every read) need; ``allowed_hosts``: the ``Host`` names accepted (None: any, for a
    non-loopback address, where the token guards)."""
    folder = RunsFolder(root)
    streams = Streams(folder)

    def run_of(request: Request) -> Run:
        rid = request.query_params.get("run")
        if not rid:
            raise ValueError("'run' is required: the run's folder relative to the runs folder (see /api/runs)")
        return folder.get(rid)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store", "content-security-policy":
                                                            PAGE_CSP, "x-content-type-options": "nosniff",
                                                            "x-frame-options": "DENY"})

    @_handler
    async def api_runs(request: Request) -> Response:
        runs = await asyncio.to_thread(lambda: [r.info() for r in folder.runs().values()])
        return JSONResponse({"root": str(folder.root), "runs": runs, "ratings_token": ratings_token is not None})

    @_handler
    async def api_keys(request: Request) -> Response:
        run = run_of(request)
        await asyncio.to_thread(run.metrics.update_all)
        defaults = run.metrics.default_charts()
        curves = {}
        if request.query_params.get("n"):  # the default charts' curves too: the first paint in one request
            n = _points(request)
            curves = await asyncio.to_thread(lambda: {k: run.metrics.curve(k, n) for k in defaults})
        return FastJSON({"run": run.id, **run.metrics.summary(), "last_row": run.metrics.last_row,
                         "defaults": defaults, "curves": curves})

    @_handler
    async def api_curves(request: Request) -> Response:
        run = run_of(request)
        n = _points(request)
        keys = [k for k in request.query_params.get("keys", "").split(",") if k]
        await asyncio.to_thread(run.metrics.update_all)
        curves = await asyncio.to_thread(lambda: {k: run.metrics.curve(k, n) for k in keys})
        m = run.metrics
        return FastJSON({"run": run.id, "curves": curves, "rows": m.rows, "skipped": m.skipped,
                             "skipped_examples": m.skipped_examples,
                             "missing": [k for k in keys if k not in m.series]})

    session_fields = ("session_id", "task_id", "group_id", "status", "error", "reward", "num_calls", "step",
                      "tokens", "trainable_tokens", "timings", "attempts", "output")

    @_handler
    async def api_sessions(request: Request) -> Response:
        run = run_of(request)
        qp = request.query_params
        offset, limit = int(qp.get("offset", "0")), min(500, int(qp.get("limit", "100")))
        if not qp.get("step") and not qp.get("status"):  # a plain page: only its rows are read
            page_rows, total, note = await asyncio.to_thread(run.session_page, offset, limit)
            return JSONResponse({"run": run.id, "total": total, "all": total, "offset": offset, "note": note,
                                 "rows": [_session_summary(r, session_fields) for r in page_rows], "step": None})
        rows, note = await asyncio.to_thread(run.session_rows)
        sel = rows
        if qp.get("step"):
            step = float(qp["step"])
            steps = sorted({float(r["step"]) for r in rows if isinstance(r.get("step"), (int, float))})
            # the link from a curve: the sessions of the step nearest the clicked point
            near = min(steps, key=lambda s: abs(s - step)) if steps else None
            sel = [r for r in rows if r.get("step") == near]
        if qp.get("status"):
            sel = [r for r in sel if r.get("status") == qp["status"]]
        page = [{k: r.get(k) for k in session_fields} for r in sel[offset:offset + limit]]
        for p in page:
            output = p.get("output")
            if isinstance(output, str):
                p["output"] = output[:200]
        return JSONResponse({"run": run.id, "total": len(sel), "all": len(rows), "offset": offset, "rows": page,
                             "note": note, "step": sel[0].get("step") if qp.get("step") and sel else None})

    @_handler
    async def api_session(request: Request) -> Response:
        run = run_of(request)
        sid = request.query_params.get("id", "")
        return JSONResponse(await asyncio.to_thread(run.session, sid))

    @_handler
    async def api_recordings(request: Request) -> Response:
        run = run_of(request)
        recs = await asyncio.to_thread(run.recordings)
        qp = request.query_params
        if qp.get("step"):  # the link from a curve: the recordings of the checkpoint nearest the clicked step
            step = float(qp["step"])
            with_steps = [r for r in recs if isinstance(r.get("env_steps"), (int, float))]
            if with_steps:
                near = min(with_steps, key=lambda r: abs(r["env_steps"] - step))["env_steps"]
                recs = [r for r in with_steps if r["env_steps"] == near]
        return JSONResponse({"run": run.id, "recordings": recs})

    @_handler
    async def api_episode(request: Request) -> Response:
        run = run_of(request)
        qp = request.query_params
        return JSONResponse(await asyncio.to_thread(run.episode, qp.get("tag", ""), qp.get("ep", "")))

    @_handler
    async def api_events(request: Request) -> Response:
        run = run_of(request)
        await asyncio.to_thread(run.metrics.update_all)
        return JSONResponse({"run": run.id, **await asyncio.to_thread(run.events)})

    @_handler
    async def api_logs(request: Request) -> Response:
        run = run_of(request)
        return JSONResponse({"run": run.id, **await asyncio.to_thread(run.logs, request.query_params.get("q", ""))})

    @_handler
    async def api_ratings(request: Request) -> Response:
        run = run_of(request)
        if request.method == "POST":
            if ratings_token is not None:
                if not token_ok(given_token(request.headers, request.cookies), ratings_token):
                    return _error(401, "ratings need the dashboard's token ($POLAR_DASHBOARD_TOKEN): "
                                       "enter it in the Ratings box, sent as the X-Polar-Token header")
            try:  # a rating is a few hundred bytes: a bigger or a dripped body is refused while it streams
                body = json.loads(await read_body(request.stream(), request.headers.get("content-length"),
                                                  RATING_BODY_BYTES, BODY_TIMEOUT_S, "the rating"))
            except BodyError as e:
                return _error(e.status, f"{e}; a rating is a small JSON object")
            except ValueError:
                raise ValueError("the rating must be a JSON object with kind, target, score and comment") from None
            rating = ratings.validate(body)
            info = await asyncio.to_thread(run.target_info, rating["kind"], rating["target"])
            row = await asyncio.to_thread(ratings.append, run.path, {**rating, "task_id": info["task_id"],
                                                                    "reward": info["reward"]})
            return JSONResponse(row)
        rows, skipped = await asyncio.to_thread(ratings.read, run.path)
        return JSONResponse({"run": run.id, "ratings": list(ratings.latest(rows).values()),
                             "agreement": ratings.agreement(rows), "skipped": skipped})

    @_handler
    async def api_reports(request: Request) -> Response:
        return JSONResponse({"reports": await asyncio.to_thread(folder.reports)})

    @_handler
    async def api_report(request: Request) -> Response:
        p = safe_path(folder.root, request.query_params.get("id", "") + "/report.json")
        try:
            data = json.loads(await asyncio.to_thread(p.read_text))
        except FileNotFoundError:
            raise KeyError(request.query_params.get("id", "")) from None
        except ValueError as e:
            return JSONResponse({"error": f"report.json is unreadable: {e}", "report": None})
        return JSONResponse({"report": data})

    @_handler
    async def files(request: Request) -> Response:
        p = safe_path(folder.root, request.path_params["path"])
        if not p.is_file():
            raise KeyError(request.path_params["path"])
        headers = dict(USER_FILE_HEADERS)
        if p.suffix.lower() in (".yaml", ".yml", ".json"):
            # configs (and the harness in an episode index), also of runs written before redaction
            if p.stat().st_size > REDACT_MAX_BYTES:
                raise ValueError(f"{request.path_params['path']} is over {REDACT_MAX_BYTES >> 20} MiB: YAML/JSON is "
                                 "served only with its secrets redacted, which needs it parsed; read it on disk")
            text = await asyncio.to_thread(p.read_text, errors="replace")
            headers["content-disposition"] = f"attachment; filename*=utf-8''{quote(p.name)}"
            return Response(redact_yaml_text(text), media_type="text/plain; charset=utf-8", headers=headers)
        if p.suffix.lower() in INLINE_MEDIA:  # episode frames shown by <img>: still no script, no sniffing
            return FileResponse(p, media_type=INLINE_MEDIA[p.suffix.lower()], headers=headers,
                                content_disposition_type="inline", filename=p.name)
        return FileResponse(p, media_type="application/octet-stream", headers=headers,
                            content_disposition_type="attachment", filename=p.name)

    async def stream(request: Request) -> Response:
        runs = {r for r in request.query_params.get("runs", "").split(",") if r}
        q = streams.subscribe(runs)

        async def events() -> AsyncIterator[str]:
            try:
                yield ": polar dashboard events\n\n"
                while True:
                    try:
                        event, data = await asyncio.wait_for(q.get(), 15)
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    yield f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"
            finally:
                streams.unsubscribe(q)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)

    routes = [
        Route("/", index),
        Route("/favicon.ico", favicon),
        Route("/api/runs", api_runs),
        Route("/api/keys", api_keys),
        Route("/api/curves", api_curves),
        Route("/api/sessions", api_sessions),
        Route("/api/session", api_session),
        Route("/api/recordings", api_recordings),
        Route("/api/episode", api_episode),
        Route("/api/events", api_events),
        Route("/api/logs", api_logs),
        Route("/api/ratings", api_ratings, methods=["GET", "POST"]),
        Route("/api/reports", api_reports),
        Route("/api/report", api_report),
        Route("/api/stream", stream),
        Route("/files/{path:path}", files),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.folder = folder
    guarded = Guard(app, allowed_hosts, ratings_token, token_for_reads)

    warm_done = threading.Event()
    app.state.warm_done = warm_done  # set once every run found at start is indexed and its curves downsampled

    def warm() -> None:  # index every run once in the background, so the first curve needs no full read
        try:
            for run in folder.runs().values():
                try:
                    run.metrics.update_all()
                    run.metrics.warm_curves()
                    if not run.sessions_paged():  # a big store is paged, and parsed whole only when a filter needs it
                        run.sessions.update()
                except Exception:
                    log.exception("dashboard: indexing %s failed", run.path)
        finally:
            warm_done.set()

    threading.Thread(target=warm, name="polar-dashboard-index", daemon=True).start()
    return guarded
