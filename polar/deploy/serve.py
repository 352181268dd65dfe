"""``polar serve``: an Open Inference Protocol v2 (KServe) server for exported policies or a run's checkpoints.

- ``GET /v2/health/live``, ``/v2/health/ready``, ``GET /v2``, ``GET /v2/models/{name}[/versions/{v}]``,
  ``GET .../ready``, ``POST .../infer`` (``inputs: [{name, shape, datatype, data}]``); errors are ``{"error": ...}``
  with a 4xx that names the field.
- ``POST /v1/act``: ``{"observation": ...}`` (one) or ``{"observations": [...]}`` (a batch) in plain JSON.
- Micro-batching: concurrent requests to one version are run as one batch (up to ``max_batch_size`` rows,
  waiting at most ``max_wait_ms`` after the first), on one worker thread per version.
- Recurrent policies keep their state per client session (``parameters.session_id`` or the
  ``x-polar-session`` header), in a bounded LRU; ``episode_start: true`` resets it.
- ``deterministic`` (default true) or sampled actions: the server draws the graph's ``noise`` input.
- Versions side by side; a watcher loads each new export or checkpoint fully (and runs it once) before it
  becomes the default, so no request fails during a swap. One that fails to load is logged with why, and
  the old version keeps serving. The oldest beyond ``max_versions`` retire once their queued requests ran.
- Prometheus metrics at ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from polar import httpserver
from polar.deploy.body import BodyError, BodyParser
from polar.deploy.graph import NUMPY_DTYPES, OIP_DATATYPES, GraphSpec
from polar.deploy.runtime import MANIFEST, Runner, _first_line, load_export, smoke_test
from polar.errors import DeployError
from polar.httpserver import ConnectionLimits, require_token_off_loopback

if TYPE_CHECKING:
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

    Handler = Callable[[Request], Awaitable[Response]]

log = logging.getLogger(__name__)

SESSION_HEADER = "x-polar-session"


@dataclass
class ServeSettings:
    backend: str = "auto"  # auto | onnxruntime | torch (a run dir: which runner its checkpoints load into)
    max_batch_size: int = 256  # rows per model call; a request with more is refused (413)
    max_wait_ms: float = 2.0  # how long the first queued request waits for others to join its batch
    max_sessions: int = 10_000  # recurrent state kept for this many client sessions (least recently used go)
    max_versions: int = 3  # versions loaded side by side; the oldest retire
    poll_s: float = 1.0  # how often the watched directory is scanned for new versions (0 = never)
    max_body_bytes: int = 16 * 1024 * 1024
    body_timeout_s: float = 60.0  # the most a request body may take to arrive once its headers have (then 408)
    threads: int = 1  # onnxruntime intra-op threads per version
    seed: int | None = None  # sampled actions' RNG
    token: str | None = None  # when set, every route but the health checks needs "Authorization: Bearer <token>"
    name: str | None = None  # model name (default: the folder layout's <name>/<version>, else the run's name)
    trust_code: bool = False  # load TorchScript exports and runs whose config names code (custom agents, envs)
    allowed_hosts: frozenset[str] | None = None  # Host names answered (None: any); `serve` on loopback: loopback names
    # header deadline and size, idle keep-alive (5 s), open connections: the gateway's limits (polar.httpserver)
    limits: ConnectionLimits = field(default_factory=lambda: ConnectionLimits(keep_alive_s=5.0))


class RequestError(Exception):
    """A client error: answered as ``{"error": message}`` with ``status``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------- batching
@dataclass
class _Item:
    feeds: dict[str, np.ndarray]
    rows: int
    future: asyncio.Future


class Batcher:
    """Queues requests for one loaded version and runs them together, on one thread, in arrival order."""

    def __init__(self, runner: Runner, settings: ServeSettings, metrics: Metrics) -> None:
        self.runner = runner
        self.settings = settings
        self.metrics = metrics
        self.queue: asyncio.Queue = asyncio.Queue()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="polar-serve")
        self.task = asyncio.get_running_loop().create_task(self._loop())

    def submit(self, feeds: dict[str, np.ndarray], rows: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Item(feeds, rows, fut))
        return fut

    def retire(self) -> None:
        """Stop after every request queued so far has run."""
        self.queue.put_nowait(None)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        closing = False
        while not closing:
            item = await self.queue.get()
            if item is None:
                break
            batch, rows = [item], item.rows
            deadline = loop.time() + self.settings.max_wait_ms / 1000
            while rows < self.settings.max_batch_size:
                try:
                    nxt = self.queue.get_nowait()
                except asyncio.QueueEmpty:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    try:
                        nxt = await asyncio.wait_for(self.queue.get(), left)
                    except TimeoutError:
                        break
                if nxt is None:
                    closing = True
                    break
                if rows + nxt.rows > self.settings.max_batch_size:  # full: run it, and start the next with nxt
                    await self._run(batch)
                    batch, rows = [nxt], nxt.rows
                    deadline = loop.time() + self.settings.max_wait_ms / 1000
                    continue
                batch.append(nxt)
                rows += nxt.rows
            await self._run(batch)
        self.executor.shutdown(wait=False)
        self.runner.close()

    async def _run(self, batch: list[_Item]) -> None:
        names = list(batch[0].feeds)
        feeds = {n: np.concatenate([it.feeds[n] for it in batch]) if len(batch) > 1 else batch[0].feeds[n]
                 for n in names}
        self.metrics.batch_rows.observe(sum(it.rows for it in batch))
        try:
            outs = await asyncio.get_running_loop().run_in_executor(self.executor, self.runner.run, feeds)
        except Exception as e:
            for it in batch:
                if not it.future.done():
                    it.future.set_exception(e)
            return
        start = 0
        for it in batch:
            if not it.future.done():
                it.future.set_result({k: v[start:start + it.rows] for k, v in outs.items()})
            start += it.rows


# ---------------------------------------------------------------------------------------------- versions
@dataclass
class ModelVersion:
    name: str
    version: str
    runner: Runner
    manifest: dict[str, Any]
    source: str
    batcher: Batcher | None = None
    loaded_at: float = field(default_factory=time.time)

    @property
    def spec(self) -> GraphSpec:
        return self.runner.spec

    @property
    def order(self) -> tuple:
        return (int(self.version) if self.version.isdigit() else -1, self.loaded_at)


@dataclass
class Candidate:
    version: str
    path: Path
    signature: tuple


class Source:
    """Where versions come from: an export directory (or a directory of them), or a run's checkpoints."""

    def __init__(self, path: str | Path, settings: ServeSettings) -> None:
        self.path = Path(path)
        self.settings = settings
        self.run_mode = (self.path / "run.json").is_file()
        if not self.path.is_dir():
            raise DeployError(f"{self.path} is not a directory; pass an export directory (polar export --out) or a "
                              "run directory")
        if settings.backend not in ("auto", "onnxruntime", "torch"):
            raise DeployError(f"--backend {settings.backend!r}: choose auto, onnxruntime or torch")
        if self.run_mode:
            self._init_run()
        else:
            self.name = settings.name

    def _init_run(self) -> None:
        from polar.config.trust import require_trust
        from polar.harness import make_vector_env
        from polar.trainers.loading import load_run

        self.run_dir, self.cfg = load_run(self.path)
        require_trust(self.cfg, f"run {self.path}", self.settings.trust_code)
        if self.cfg.kind == "agent":
            raise DeployError(f"{self.path} is an LLM agent run; polar serve serves env policies (serve LLM weights "
                              "with `polar gateway`)")
        probe = make_vector_env(self.cfg.harness, 1, seed=0, config_dir=self.cfg.config_dir)
        try:
            self.spaces = (probe.single_observation_space, probe.single_action_space)
        finally:
            probe.close()
        self.name = self.settings.name or self.cfg.name

    def candidates(self) -> list[Candidate]:
        """Every version on disk now, oldest first (unreadable manifests count: their load fails, logged)."""
        found: list[Candidate] = []
        if self.run_mode:
            for p in self.run_dir.checkpoints_dir.glob("ckpt_*.pt"):
                digits = p.stem.removeprefix("ckpt_")
                if digits.isdigit():
                    st = p.stat()
                    found.append(Candidate(str(int(digits)), p, (st.st_mtime_ns, st.st_size)))
            return sorted(found, key=lambda c: int(c.version))
        single = (self.path / MANIFEST).is_file()
        dirs = [self.path] if single else []
        dirs += sorted(d for d in self.path.iterdir() if d.is_dir() and not d.name.startswith(".")
                       and (d / MANIFEST).is_file())
        for d in dirs:
            st = (d / MANIFEST).stat()
            if d.name.isdigit():  # the model repository layout (KServe, Triton): <name>/<version>/
                version = str(int(d.name))
            else:
                try:
                    version = str(json.loads((d / MANIFEST).read_text()).get("version", d.name))
                except (OSError, ValueError, AttributeError):
                    version = d.name
            found.append(Candidate(version, d, (st.st_mtime_ns, st.st_size)))
        return sorted(found, key=lambda c: (int(c.version) if c.version.isdigit() else -1, str(c.path)))

    def layout_name(self) -> str | None:
        """The model name the folder layout gives: ``NAME/`` holding version folders ``1/``, ``2/``, or the
        version folder ``NAME/1/`` itself; None when the folders are not numbered."""
        if (self.path / MANIFEST).is_file():
            return self.path.resolve().parent.name if self.path.name.isdigit() else None
        numbered = any(d.name.isdigit() and (d / MANIFEST).is_file() for d in self.path.iterdir() if d.is_dir())
        return self.path.resolve().name if numbered else None

    def load(self, cand: Candidate) -> ModelVersion:
        """Load one version fully (and run it once); any failure is a ``DeployError`` saying why."""
        if self.run_mode:
            return self._load_checkpoint(cand)
        runner, manifest = load_export(cand.path, self.settings.threads, self.settings.trust_code)
        want = self.settings.backend
        if want != "auto" and runner.backend != want:
            raise DeployError(f"{cand.path} is a {manifest['format']} export, which runs on {runner.backend}, not "
                              f"--backend {want}; export it with --format "
                              f"{'onnx' if want == 'onnxruntime' else 'torchscript'}")
        name = str(self.name or self.layout_name() or manifest["name"])
        self.name = name
        return ModelVersion(name, cand.version, runner, manifest, str(cand.path))

    def _load_checkpoint(self, cand: Candidate) -> ModelVersion:
        from polar.deploy.export import graph_runner, space_json
        from polar.deploy.graph import PolicyGraph
        from polar.models.policy import build_policy
        from polar.trainers.checkpoint import load_checkpoint

        state = load_checkpoint(cand.path)
        policy = build_policy(self.cfg, *self.spaces, self.cfg.config_dir)
        try:
            policy.load_state_dict(state["policy"])
        except (KeyError, RuntimeError) as e:
            raise DeployError(f"{cand.path}: its weights do not fit the run's config ({_first_line(e)})") from None
        policy.eval()
        graph = PolicyGraph(policy).eval()
        backend = "onnxruntime" if self.settings.backend == "auto" else self.settings.backend
        runner = graph_runner(graph, "torch" if backend == "torch" else "onnx", self.settings.threads)
        smoke_test(runner, str(cand.path))
        manifest = {"name": self.name, "version": cand.version, "format": "checkpoint", "run": {
            "path": str(self.path), "checkpoint": cand.path.name, "iteration": int(state.get("iteration", 0))},
            "observation_space": space_json(self.spaces[0]), "action_space": space_json(self.spaces[1])}
        return ModelVersion(str(self.name), cand.version, runner, manifest, str(cand.path))


# ---------------------------------------------------------------------------------------------- sessions
@dataclass
class _Session:
    state: dict[str, np.ndarray] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Sessions:
    """Recurrent state per client session, least recently used dropped past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: OrderedDict[str, _Session] = OrderedDict()

    def get(self, key: str) -> _Session:
        s = self.items.get(key)
        if s is None:
            s = self.items[key] = _Session()
            while len(self.items) > self.limit:
                old_key, old = next(iter(self.items.items()))
                if old.lock.locked():  # in use right now: keep it, drop the next one
                    self.items.move_to_end(old_key)
                    if all(v.lock.locked() for v in self.items.values()):
                        break
                    continue
                self.items.popitem(last=False)
        else:
            self.items.move_to_end(key)
        return s


# ---------------------------------------------------------------------------------------------- metrics
class Metrics:
    def __init__(self) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise DeployError("polar serve needs prometheus_client (pip install 'polar-rl[deploy]')") from None
        self.prom = prom
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter("polar_serve_requests", "requests answered", ["endpoint", "code"], registry=r)
        self.latency = prom.Histogram("polar_serve_request_seconds", "request latency", ["endpoint"], registry=r,
                                      buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0))
        self.batch_rows = prom.Histogram("polar_serve_batch_rows", "rows per model call", registry=r,
                                         buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.reloads = prom.Counter("polar_serve_reloads", "version loads by outcome", ["outcome"], registry=r)
        self.versions = prom.Gauge("polar_serve_versions_loaded", "model versions loaded", registry=r)
        self.sessions = prom.Gauge("polar_serve_sessions", "recurrent client sessions held", registry=r)

    def render(self) -> bytes:
        return self.prom.generate_latest(self.registry)


# ---------------------------------------------------------------------------------------------- the server
class PolicyServer:
    """The versions, sessions and request handling behind the HTTP routes (``build_app``)."""

    def __init__(self, source: Source, settings: ServeSettings) -> None:
        self.source = source
        self.settings = settings
        self.versions: dict[str, ModelVersion] = {}
        self.default: ModelVersion | None = None
        self.sessions = Sessions(settings.max_sessions)
        self.metrics = Metrics()
        self.rng = np.random.default_rng(settings.seed)
        self.parser = BodyParser()
        self.seen: dict[str, tuple] = {}  # path -> signature already tried (loaded or failed)
        self.failures: dict[str, str] = {}  # path -> why its last load failed
        self._watch: asyncio.Task | None = None
        self.startup_error: DeployError | None = None
        self.on_startup_error: Callable[[], None] | None = None  # set by `serve`: stops uvicorn when no version loads

    @property
    def name(self) -> str:
        return self.source.name or "policy"

    # --- loading --------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the newest version that loads (older ones are tried when newer fail), then watch for more."""
        cands = await asyncio.to_thread(self.source.candidates)
        if not cands:
            what = "checkpoint" if self.source.run_mode else "export (a directory with manifest.json)"
            raise DeployError(f"{self.source.path} holds no {what} to serve")
        for cand in reversed(cands):
            if await self._try_load(cand):
                break
        if self.default is None:
            raise DeployError(f"no version in {self.source.path} loads: " + "; ".join(self.failures.values()))
        for cand in cands:  # the older ones are not wanted now; do not load them on the next scan
            self.seen.setdefault(str(cand.path), cand.signature)
        if self.settings.poll_s > 0:
            self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for mv in list(self.versions.values()):
            if mv.batcher is not None:
                mv.batcher.retire()
        await asyncio.gather(*(mv.batcher.task for mv in self.versions.values() if mv.batcher is not None),
                             return_exceptions=True)
        self.parser.close()

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_s)
            try:
                await self.scan()
            except Exception:  # the watcher must outlive a bad directory listing; say why
                log.exception("scanning %s for new versions failed", self.source.path)

    async def scan(self) -> list[str]:
        """Load every new or changed version on disk; returns the versions loaded."""
        loaded = []
        for cand in await asyncio.to_thread(self.source.candidates):
            if self.seen.get(str(cand.path)) == cand.signature:
                continue
            if self.default is not None and cand.version.isdigit() and self.default.version.isdigit() \
                    and int(cand.version) < int(self.default.version) and cand.version not in self.versions:
                self.seen[str(cand.path)] = cand.signature  # older than what serves: not a rollout
                continue
            if await self._try_load(cand):
                loaded.append(cand.version)
        return loaded

    async def _try_load(self, cand: Candidate) -> bool:
        self.seen[str(cand.path)] = cand.signature
        try:
            mv = await asyncio.to_thread(self.source.load, cand)
        except Exception as e:  # a corrupt export or checkpoint: the old version keeps serving
            why = str(e) if isinstance(e, DeployError) else _first_line(e)
            self.failures[str(cand.path)] = why
            self.metrics.reloads.labels("failed").inc()
            serving = self.default.version if self.default is not None else "none"
            log.warning("not loading version %s from %s: %s (still serving version %s)", cand.version, cand.path,
                        why, serving)
            return False
        self.failures.pop(str(cand.path), None)
        self._install(mv)
        return True

    def _install(self, mv: ModelVersion) -> None:
        """Swap ``mv`` in (the event loop runs this in one step, so every request sees old or new, whole)."""
        mv.batcher = Batcher(mv.runner, self.settings, self.metrics)
        old = self.versions.get(mv.version)
        self.versions[mv.version] = mv
        if old is not None and old.batcher is not None:
            old.batcher.retire()
        if self.default is None or mv.order >= self.default.order:
            self.default = mv
        while len(self.versions) > self.settings.max_versions:
            oldest = min((v for v in self.versions.values() if v is not self.default), key=lambda v: v.order)
            del self.versions[oldest.version]
            if oldest.batcher is not None:
                oldest.batcher.retire()
            log.info("retired version %s of %s", oldest.version, self.name)
        self.metrics.reloads.labels("loaded").inc()
        self.metrics.versions.set(len(self.versions))
        log.info("serving version %s of %s from %s (%s); default version %s", mv.version, mv.name, mv.source,
                 mv.runner.backend, self.default.version)

    # --- resolving --------------------------------------------------------------------------------------
    def resolve(self, name: str, version: str | None) -> ModelVersion:
        if name != self.name:
            raise RequestError(f"model {name!r} is not served here (models: {self.name})", 404)
        if version is None:
            if self.default is None:
                raise RequestError(f"model {name!r} has no version loaded yet", 503)
            return self.default
        mv = self.versions.get(version)
        if mv is None:
            loaded = ", ".join(sorted(self.versions, key=lambda v: self.versions[v].order)) or "none"
            raise RequestError(f"version {version!r} of model {name!r} is not loaded (loaded: {loaded})", 404)
        return mv

    # --- inference ----------------------------------------------------------------------------------------
    async def infer(self, name: str, version: str | None, obs_feeds: dict[str, np.ndarray], rows: int,
                    params: dict[str, Any], given_state: dict[str, np.ndarray]) -> tuple[ModelVersion, dict]:
        """Run one request: session state in, micro-batched call, session state out."""
        mv = self.resolve(name, version)  # checked now for a fast 4xx; resolved again right before submit
        session_id = params.get("session_id")
        if mv.spec.recurrent and session_id is not None and not given_state:
            session = self.sessions.get(f"{name}/{session_id}")
            async with session.lock:
                mv = self.resolve(name, version)
                state = session.state
                if params.get("episode_start") or state is None or not _state_fits(state, mv.spec, rows):
                    state = None
                outs = await self._submit(mv, obs_feeds, rows, params, state)
                session.state = {s["input"]: outs[s["output"]] for s in mv.spec.state}
                self.metrics.sessions.set(len(self.sessions.items))
            return mv, outs
        return mv, await self._submit(mv, obs_feeds, rows, params, given_state or None)

    async def _submit(self, mv: ModelVersion, obs_feeds: dict[str, np.ndarray], rows: int, params: dict[str, Any],
                      state: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        spec = mv.spec
        if rows > self.settings.max_batch_size:
            raise RequestError(f"'inputs[0].shape': a batch of {rows} rows is over this server's max_batch_size "
                               f"{self.settings.max_batch_size}; split the request", 413)
        feeds = dict(obs_feeds)
        for s in spec.state:
            if state is not None and s["input"] in state:
                feeds[s["input"]] = state[s["input"]]
            else:
                feeds[s["input"]] = np.zeros([rows, *s["shape"][1:]], np.float32)
        deterministic = params.get("deterministic", True)
        if spec.noise is not None:
            from polar.deploy.export import noise_for

            noise = noise_for(spec, rows, None if deterministic else self.rng)
            if noise is not None:  # always, as spec.noise is set
                feeds["noise"] = noise
        if mv.batcher is None:  # installed versions always have one
            raise DeployError(f"version {mv.version} of {mv.name} is not running")
        outs = await mv.batcher.submit(feeds, rows)
        if spec.kind == "q_greedy" and not deterministic and spec.epsilon > 0:
            explore = self.rng.random(rows) < spec.epsilon
            outs["action"] = np.where(explore, self.rng.integers(spec.outputs[1].shape[1], size=rows), outs["action"])
        return outs


def _state_fits(state: dict[str, np.ndarray], spec: GraphSpec, rows: int) -> bool:
    return all(s["input"] in state and state[s["input"]].shape == (rows, *s["shape"][1:]) for s in spec.state)


# ---------------------------------------------------------------------------------------------- parsing
def _parse_params(params: Any, where: str = "parameters") -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise RequestError(f"'{where}' must be an object of name: value pairs (got {type(params).__name__})")
    out: dict[str, Any] = {}
    for key in ("deterministic", "episode_start"):
        if key in params:
            if not isinstance(params[key], bool):
                raise RequestError(f"'{where}.{key}' must be true or false (got {params[key]!r})")
            out[key] = params[key]
    if "session_id" in params:
        sid = params["session_id"]
        if not isinstance(sid, (str, int)) or isinstance(sid, bool) or not str(sid) or len(str(sid)) > 256:
            raise RequestError(f"'{where}.session_id' must be a non-empty string of at most 256 characters")
        out["session_id"] = str(sid)
    return out


MAX_DEPTH = 32  # nesting of a tensor's data lists (numpy allows 64 dimensions; no policy input has 32)


def _depth(data: Any) -> int:
    """How deep the first elements of ``data`` nest (bounded: stops past ``MAX_DEPTH``)."""
    depth = 0
    while isinstance(data, list) and depth <= MAX_DEPTH:
        depth += 1
        data = data[0] if data else None
    return depth


def _to_array(data: Any, dtype: str, shape: list[int], where: str) -> np.ndarray:
    if _depth(data) > MAX_DEPTH or (isinstance(data, np.ndarray) and data.ndim > MAX_DEPTH):
        raise RequestError(f"'{where}.data' nests lists more than {MAX_DEPTH} deep; send it flat, or nested as its "
                           "shape")
    want = math.prod(shape) if shape else 1  # Python ints: a shape like [2**62, 2**62] cannot wrap around
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        raise RequestError(f"'{where}.data' is ragged: nested lists of unequal lengths") from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise RequestError(f"'{where}.data' must hold numbers (got {'strings' if arr.dtype.kind == 'U' else 'other values'})")
    if arr.dtype == bool and dtype != "bool":
        raise RequestError(f"'{where}.data' holds booleans; this input takes {OIP_DATATYPES[dtype]}")
    if np.issubdtype(np.dtype(dtype), np.integer) and arr.dtype.kind == "f":
        raise RequestError(f"'{where}.data' holds fractional numbers; this input takes {OIP_DATATYPES[dtype]}")
    if arr.size != want:
        raise RequestError(f"'{where}.data' has {arr.size} values, but shape {shape} needs {want}")
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise RequestError(f"'{where}.data' has values outside {OIP_DATATYPES[dtype]}'s range {info.min}..{info.max}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(dtype).reshape(shape)
    if out.dtype.kind == "f" and not np.isfinite(out).all():
        raise RequestError(f"'{where}.data' holds NaN, infinity or a number too large for "
                           f"{OIP_DATATYPES[dtype]}; send finite values")
    return out


def _check_shape(name: str, shape: list[int], spec_shape: list[int], where: str) -> None:
    if len(shape) != len(spec_shape) or any(s != d for s, d in zip(shape[1:], spec_shape[1:], strict=True)):
        raise RequestError(f"'{where}.shape' is {shape}, but input {name!r} has shape {spec_shape} "
                           "(-1 = any batch size)")


def accepted_inputs(spec: GraphSpec) -> list:
    """The inputs a client may send (and the metadata lists): observations and recurrent state, never the
    graph's ``noise``, which the server draws itself."""
    return [t for t in spec.inputs if t.name != "noise"]


def parse_oip(body: Any, spec: GraphSpec) -> tuple[dict[str, np.ndarray], int, dict[str, np.ndarray], list | None]:
    """(observation feeds, rows, given recurrent state, requested output names) of an OIP inference request."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object with 'inputs'")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("'inputs' must be a non-empty list of {name, shape, datatype, data}")
    allowed = {t.name: t for t in accepted_inputs(spec)}
    feeds: dict[str, np.ndarray] = {}
    rows: int | None = None
    first = None
    for i, inp in enumerate(inputs):
        where = f"inputs[{i}]"
        if not isinstance(inp, dict):
            raise RequestError(f"'{where}' must be an object {{name, shape, datatype, data}}")
        for key in ("name", "shape", "datatype", "data"):
            if key not in inp:
                raise RequestError(f"'{where}' lacks '{key}'")
        name = inp["name"]
        t = allowed.get(name) if isinstance(name, str) else None
        if t is None:
            raise RequestError(f"'{where}.name': {name!r} is not an input of this model (inputs: {', '.join(allowed)})")
        if name in feeds:
            raise RequestError(f"'{where}.name': input {name!r} is given twice")
        shape = inp["shape"]
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and not isinstance(d, bool)
                                                               and d >= 0 for d in shape):
            raise RequestError(f"'{where}.shape' must be a list of non-negative integers, batch first (got {shape!r})")
        if inp["datatype"] not in NUMPY_DTYPES:
            raise RequestError(f"'{where}.datatype' {inp['datatype']!r} is not an OIP datatype "
                               f"({', '.join(NUMPY_DTYPES)})")
        if NUMPY_DTYPES[inp["datatype"]] != t.dtype:
            raise RequestError(f"'{where}.datatype' is {inp['datatype']}, but input {name!r} takes "
                               f"{OIP_DATATYPES[t.dtype]}")
        _check_shape(name, shape, t.shape, where)
        if rows is None:
            rows, first = shape[0], name
        elif shape[0] != rows:
            raise RequestError(f"'{where}.shape': batch {shape[0]} differs from {first!r}'s batch {rows}")
        if not isinstance(inp["data"], (list, np.ndarray)):  # an array: a large body, converted by the parser
            raise RequestError(f"'{where}.data' must be a list (flat, or nested in row-major order)")
        feeds[name] = _to_array(inp["data"], t.dtype, shape, where)
    obs_names = [t.name for t in spec.inputs if t.name.startswith("obs")]
    missing = [n for n in obs_names if n not in feeds]
    if missing:
        t = spec.require(missing[0])
        raise RequestError(f"'inputs' lacks {missing[0]!r} ({OIP_DATATYPES[t.dtype]}, shape {t.shape})")
    if not rows:
        raise RequestError("'inputs[0].shape': the batch is empty (0 rows)")
    state = {s["input"]: feeds.pop(s["input"]) for s in spec.state if s["input"] in feeds}
    if state and len(state) != len(spec.state):
        raise RequestError(f"'inputs': give every recurrent state input ({', '.join(s['input'] for s in spec.state)}) "
                           "or none (then the session's state, or zeros, is used)")
    wanted = body.get("outputs")
    names = None
    if wanted is not None:
        if not isinstance(wanted, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in wanted):
            raise RequestError("'outputs' must be a list of {name}")
        have = [t.name for t in spec.outputs]
        for j, o in enumerate(wanted):
            if o["name"] not in have:
                raise RequestError(f"'outputs[{j}].name': {o['name']!r} is not an output (outputs: {', '.join(have)})")
        names = [o["name"] for o in wanted]
    return feeds, rows, state, names


def parse_act(body: Any, spec: GraphSpec) -> tuple[dict[str, np.ndarray], int, bool]:
    """(observation feeds, rows, batched) of a ``/v1/act`` body."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object with 'observation' or 'observations'")
    if ("observation" in body) == ("observations" in body):
        raise RequestError("give either 'observation' (one) or 'observations' (a list of them)")
    batched = "observations" in body
    key = "observations" if batched else "observation"
    value = body[key]
    if batched and (not isinstance(value, (list, np.ndarray)) or not len(value)):
        raise RequestError("'observations' must be a non-empty list of observations")
    feeds = {}
    items = value if batched else [value]
    rows = len(items)
    if spec.obs_keys is None:
        t = spec.inputs[0]
        feeds["obs"] = _to_array(items, t.dtype, [rows, *t.shape[1:]], key)
    else:
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise RequestError(f"'{key}{f'[{i}]' if batched else ''}' must be an object with keys "
                                   f"{', '.join(spec.obs_keys)}")
            miss = [k for k in spec.obs_keys if k not in item]
            if miss:
                raise RequestError(f"'{key}{f'[{i}]' if batched else ''}' lacks key {miss[0]!r} "
                                   f"(keys: {', '.join(spec.obs_keys)})")
        for k in spec.obs_keys:
            t = spec.require(f"obs.{k}")
            feeds[t.name] = _to_array([it[k] for it in items], t.dtype, [rows, *t.shape[1:]], f"{key}.{k}")
    return feeds, rows, batched


# ---------------------------------------------------------------------------------------------- HTTP
def build_app(server: PolicyServer) -> ASGIApp:  # Starlette, maybe wrapped in the middlewares below
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from polar import __version__

    def error(msg: str, status: int) -> JSONResponse:
        return JSONResponse({"error": msg}, status)

    async def read_json(request: Request) -> Any:
        """The body, counted as it streams (a chunked body past the limit is cut there, never read whole), and
        parsed where it cannot stall the other requests (``polar.deploy.body``)."""
        try:
            raw = await httpserver.read_body(request.stream(), request.headers.get("content-length"),
                                             server.settings.max_body_bytes, server.settings.body_timeout_s)
        except httpserver.BodyError as e:
            raise RequestError(str(e), e.status) from None
        try:
            return await server.parser.parse(raw)
        except BodyError as e:
            raise RequestError(str(e)) from None

    def timed(endpoint: str) -> Callable[[Handler], Handler]:
        def wrap(fn: Handler) -> Handler:
            async def handler(request: Request) -> Response:
                t0 = time.perf_counter()
                try:
                    resp = await fn(request)
                except RequestError as e:
                    resp = error(str(e), e.status)
                except DeployError as e:
                    resp = error(str(e), 500)
                except Exception as e:  # a bug must not take the server down; the client learns what happened
                    log.exception("%s failed", endpoint)
                    resp = error(f"internal error: {_first_line(e)}", 500)
                server.metrics.requests.labels(endpoint, str(resp.status_code)).inc()
                server.metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)
                return resp
            return handler
        return wrap

    def metadata(mv: ModelVersion) -> dict[str, Any]:
        versions = sorted(server.versions, key=lambda v: server.versions[v].order)
        return {"name": mv.name, "versions": versions, "platform": mv.runner.platform,
                "inputs": [t.oip() for t in accepted_inputs(mv.spec)], "outputs": [t.oip() for t in mv.spec.outputs],
                "parameters": {"version": mv.version, "default_version": server.default.version if server.default else None,
                               "kind": mv.spec.kind, "recurrent": mv.spec.recurrent, "source": mv.source,
                               "observation_space": json.dumps(mv.manifest.get("observation_space")),
                               "action_space": json.dumps(mv.manifest.get("action_space"))}}

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        if server.default is None:
            return error("no model version is loaded yet", 503)
        return JSONResponse({"ready": True})

    async def server_meta(request: Request) -> Response:
        return JSONResponse({"name": "polar", "version": __version__, "extensions": []})

    @timed("model_metadata")
    async def model_meta(request: Request) -> Response:
        p = request.path_params
        return JSONResponse(metadata(server.resolve(p["name"], p.get("version"))))

    @timed("model_ready")
    async def model_ready(request: Request) -> Response:
        p = request.path_params
        mv = server.resolve(p["name"], p.get("version"))
        return JSONResponse({"name": mv.name, "version": mv.version, "ready": True})

    def session_of(request: Request, params: dict[str, Any]) -> dict[str, Any]:
        header = request.headers.get(SESSION_HEADER)
        if header and "session_id" not in params:
            params = {**params, **_parse_params({"session_id": header}, SESSION_HEADER)}
        return params

    @timed("infer")
    async def infer(request: Request) -> Response:
        p = request.path_params
        server.resolve(p["name"], p.get("version"))  # unknown model/version: 404 before reading the body
        body = await read_json(request)
        mv = server.resolve(p["name"], p.get("version"))
        feeds, rows, state, wanted = await anyio.to_thread.run_sync(parse_oip, body, mv.spec)
        params = session_of(request, _parse_params(body.get("parameters")))
        mv, outs = await server.infer(p["name"], p.get("version"), feeds, rows, params, state)
        names = wanted or [t.name for t in mv.spec.outputs]
        specs = {t.name: t for t in mv.spec.outputs}
        resp: dict[str, Any] = {"model_name": mv.name, "model_version": mv.version,
                                "outputs": [{"name": n, "shape": list(outs[n].shape), "datatype": OIP_DATATYPES[specs[n].dtype],
                                             "data": outs[n].reshape(-1).tolist()} for n in names]}
        if "id" in body:
            resp["id"] = body["id"]
        if "session_id" in params:
            resp["parameters"] = {"session_id": params["session_id"]}
        return JSONResponse(resp)

    @timed("act")
    async def act(request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object with 'observation' or 'observations'")
        name = body.get("model", server.name)
        version = body.get("version")
        if version is not None and not isinstance(version, (str, int)):
            raise RequestError("'version' must be a string or an integer")
        version = None if version is None else str(version)
        mv = server.resolve(name, version)
        feeds, rows, batched = await anyio.to_thread.run_sync(parse_act, body, mv.spec)
        params = session_of(request, _parse_params({k: body[k] for k in ("deterministic", "episode_start", "session_id")
                                                     if k in body}, "body"))
        mv, outs = await server.infer(name, version, feeds, rows, params, {})
        resp: dict[str, Any] = {"model_name": mv.name, "model_version": mv.version}
        for key in ("action", "value"):
            if key in outs:
                vals = outs[key].tolist()
                resp[key + "s" if batched else key] = vals if batched else vals[0]
        return JSONResponse(resp)

    async def metrics(request: Request) -> Response:
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def not_found(request: Request, exc: Exception) -> Response:
        return error(f"no route for {request.method} {request.url.path}; see /v2/models/{server.name}", 404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error(f"{request.method} is not allowed on {request.url.path}", 405)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await server.start()
        except DeployError as e:  # nothing loads: `serve` stops uvicorn and raises it as one line
            server.startup_error = e
            if server.on_startup_error is None:
                raise
            server.on_startup_error()
            yield
            return
        try:
            yield
        finally:
            await server.stop()

    m = "/v2/models/{name}"
    v = "/v2/models/{name}/versions/{version}"
    routes = [
        Route("/v2/health/live", live), Route("/v2/health/ready", ready), Route("/v2", server_meta),
        Route(m, model_meta), Route(v, model_meta), Route(m + "/ready", model_ready), Route(v + "/ready", model_ready),
        Route(m + "/infer", infer, methods=["POST"]), Route(v + "/infer", infer, methods=["POST"]),
        Route("/v1/act", act, methods=["POST"]), Route("/metrics", metrics),
    ]
    app: ASGIApp = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_allowed})
    if server.settings.token is not None:
        app = BearerAuth(app, server.settings.token)
    if server.settings.allowed_hosts is not None:
        app = HostCheck(app, server.settings.allowed_hosts)
    return app


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


class HostCheck:
    """ASGI middleware: a server on loopback answers only requests addressed to a loopback name, so a web page
    whose DNS name was re-pointed at 127.0.0.1 (rebinding) cannot query it through the user's browser."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), "")
            name = host.strip().lower()
            name = name[1:name.find("]")] if name.startswith("[") and "]" in name else (
                name.rsplit(":", 1)[0] if name.count(":") == 1 else name)
            if name not in self.allowed:
                body = json.dumps({"error": f"Host {host!r} is not this server's address (it listens on loopback: "
                                            "use http://127.0.0.1:PORT)"}).encode()
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class BearerAuth:
    """ASGI middleware: every HTTP route but ``/v2/health/*`` needs ``Authorization: Bearer <token>`` (what
    KServe/OIP clients send), compared in constant time."""

    OPEN = ("/v2/health/live", "/v2/health/ready")

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.OPEN:
            await self.app(scope, receive, send)
            return
        import hmac

        given = b""
        for k, v in scope.get("headers", []):
            if k == b"authorization" and v[:7].lower() == b"bearer ":
                given = v[7:].strip()
        if hmac.compare_digest(given, self.token):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": "this server needs its token: send 'Authorization: Bearer <token>' "
                                    "(the value of $POLAR_SERVE_TOKEN where polar serve runs)"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def make_server(path: str | Path, settings: ServeSettings | None = None) -> PolicyServer:
    settings = settings or ServeSettings()
    if settings.max_batch_size < 1 or settings.max_wait_ms < 0 or settings.max_versions < 1 or settings.max_sessions < 1:
        raise DeployError("--max-batch-size, --max-versions and --max-sessions must be at least 1, --max-wait-ms >= 0")
    return PolicyServer(Source(path, settings), settings)


def uvicorn_config(server: PolicyServer, settings: ServeSettings, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's config for ``server``'s app with the gateway's connection limits (``settings.limits``):
    slow or huge headers and idle sockets are cut."""
    return httpserver.uvicorn_config(build_app(server), settings.limits, "policy server",
                                     **{"lifespan": "auto", "timeout_graceful_shutdown": 5, **kwargs})


def serve(path: str | Path, host: str = "127.0.0.1", port: int = 8080, settings: ServeSettings | None = None,
          announce: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted (``polar serve``). ``announce(url)`` is called with the address actually bound
    (the real host and port, also when ``port`` is 0) before the first request is accepted."""
    import uvicorn

    settings = settings or ServeSettings()
    loopback = require_token_off_loopback(host, settings.token, exposes="query the policy",
                                          token_env="POLAR_SERVE_TOKEN",
                                          token_use="clients send as 'Authorization: Bearer'", error=DeployError)
    if loopback and settings.allowed_hosts is None:
        settings.allowed_hosts = LOOPBACK_NAMES
    server = make_server(path, settings)
    if not server.source.candidates():  # a one-line error here, not a failed startup inside uvicorn
        what = "checkpoint" if server.source.run_mode else "export (a directory with manifest.json)"
        raise DeployError(f"{server.source.path} holds no {what} to serve")
    try:
        sock = httpserver.bind(host, port)
    except OSError as e:
        raise DeployError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port (0 chooses a "
                          "free one)") from None
    bound_host, bound_port = sock.getsockname()[:2]
    uv = uvicorn.Server(uvicorn_config(server, settings))

    def stop() -> None:
        uv.should_exit = True

    server.on_startup_error = stop
    if announce is not None:
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        announce(f"http://{shown}:{bound_port}")
    try:
        uv.run(sockets=[sock])
    finally:
        sock.close()
    if server.startup_error is not None:
        raise server.startup_error
