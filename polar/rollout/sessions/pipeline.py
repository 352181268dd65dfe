"""The session pipeline: INIT → RUN → POST_RUN → DONE | ERROR | TIMEOUT (| CANCELLED).

Each stage has its own worker pool (a semaphore), so preparing workspaces and verifying finished
sessions overlap with running harnesses. A session has a wall-clock budget over all stages; the harness
has its own (shorter) agent timeout. Whatever happens, POST_RUN still collects the calls the session
made, so a timed-out session yields them (reward 0, trainable only if every call's token data is
complete), and an ERROR session keeps them for inspection with every loss mask zeroed.

A session whose gateway node is lost (deregistered, silent past the registry's heartbeat timeout, or
refusing connections) is re-dispatched: its harness is stopped, and the session starts again from INIT
on another healthy node with a fresh workspace and a fresh gateway session key, up to
``max_node_retries`` times within the same session budget. A half-run harness is not resumed: its calls
on the lost node cannot be read back, so its trajectory is not recoverable token-faithfully. Failures
that are not the node's (harness crash, verifier error, timeout) are never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.errors import GatewayError
from polar.harness.agent.runners import HarnessOutcome, HarnessRunner, SessionContext
from polar.harness.agent.verifiers import Verdict, VerifyInput
from polar.metrics.logs import trace
from polar.rollout.sessions.nodes import GatewayNode, NodeRegistry
from polar.rollout.sessions.session import SessionResult, SessionSpec, SessionStatus, mask_out
from polar.types import CallRecord, TrajectorySample, new_session_key

log = logging.getLogger(__name__)

#: What scores a finished session: every verifier (built-in, user function, checked) is this call.
Verifier = Callable[[VerifyInput], Awaitable[Verdict]]


@dataclass
class PipelineSettings:
    max_init_workers: int = 8
    max_run_workers: int = 8
    max_postrun_workers: int = 4
    session_budget_s: float = 900.0
    agent_timeout_s: float = 300.0
    verifier_timeout_s: float = 60.0
    builder: str = "prefix_merging"
    model_name: str = "polar"
    workspace_root: str | None = None
    template_dir: str | None = None  # copied into every workspace
    keep_workspaces: bool = False
    max_node_retries: int = 2  # re-dispatches of one session after its gateway node was lost
    node_wait_s: float = 60.0  # how long a session waits for a healthy node with room before it is ERROR
    node_probe_timeout_s: float = 5.0  # a node that does not accept a connection within this is gone


class _NodeLost(Exception):
    """The session's gateway node is gone; the attempt cannot finish there."""


class _NoNode(Exception):
    """No healthy gateway node with room appeared within ``node_wait_s``."""


class _Stage:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.sem = asyncio.Semaphore(workers)
        self.active = 0
        self.waiting = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        self.waiting += 1
        try:
            await self.sem.acquire()
        finally:
            self.waiting -= 1
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self.sem.release()

    def load(self) -> dict[str, int]:
        return {"workers": self.workers, "active": self.active, "waiting": self.waiting,
                "available": self.workers - self.active}


class _Live:
    """Mutable per-session state while it moves through the stages."""

    def __init__(self, spec: SessionSpec) -> None:
        self.spec = spec
        self.status = SessionStatus.PENDING
        self.cancel = asyncio.Event()
        self.attempts = 0
        self.lost_nodes: list[dict[str, str]] = []
        self.budget_expired = False
        self.timings: dict[str, float] = {}
        self.new_attempt()

    def new_attempt(self) -> None:
        self.attempts += 1
        self.node: GatewayNode | None = None
        self.workspace: Path | None = None
        self.outcome: HarnessOutcome | None = None
        self.error: str | None = None
        self.node_lost: str | None = None  # set while RUN when the node is declared lost
        self.waiting_for_node = False
        self.api_key: str | None = None  # this attempt's secret gateway key (memory only), made when it runs

    @property
    def gateway_session(self) -> str:
        """The key the harness sends to the gateway: a fresh one per attempt, so records never mix."""
        sid = self.spec.session_id
        return sid if self.attempts == 1 else f"{sid}-attempt{self.attempts}"


class SessionPipeline:
    """Runs sessions on an asyncio loop. ``submit`` returns a task resolving to a :class:`SessionResult`."""

    def __init__(self, runner: HarnessRunner, verifier: Verifier, registry: NodeRegistry, settings: PipelineSettings,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.runner = runner
        self.verifier = verifier
        self.registry = registry
        self.settings = settings
        self.on_event = on_event
        self.stages = {
            "init": _Stage(settings.max_init_workers),
            "run": _Stage(settings.max_run_workers),
            "post_run": _Stage(settings.max_postrun_workers),
        }
        self._live: dict[str, _Live] = {}
        self._tasks: dict[str, asyncio.Task[SessionResult]] = {}
        self.sessions_redispatched = 0  # restarts on another node after a node was lost
        self.sessions_node_lost = 0  # sessions that ended in ERROR because no node could finish them
        root = settings.workspace_root
        self._own_root = root is None
        self.workspace_root = Path(root) if root else Path(tempfile.mkdtemp(prefix="polar-sessions-"))
        self.workspace_root.mkdir(parents=True, exist_ok=True)

    # ---- public API ------------------------------------------------------------------------------

    def submit(self, spec: SessionSpec) -> asyncio.Task[SessionResult]:
        if spec.session_id in self._live:
            raise ValueError(f"session {spec.session_id!r} is already running")
        live = _Live(spec)
        sid = spec.session_id
        self._live[sid] = live
        task = asyncio.ensure_future(self._run(live))
        self._tasks[sid] = task

        def forget(_task: asyncio.Task[SessionResult]) -> None:
            self._live.pop(sid, None)
            self._tasks.pop(sid, None)

        task.add_done_callback(forget)
        return task

    def cancel(self, session_id: str) -> bool:
        live = self._live.get(session_id)
        if live is None:
            return False
        live.cancel.set()  # RUN notices this and kills the harness; other stages check it at boundaries
        return True

    def load(self) -> dict[str, Any]:
        return {name: stage.load() for name, stage in self.stages.items()} | {
            "sessions": len(self._live), "sessions_redispatched": self.sessions_redispatched,
            "sessions_node_lost": self.sessions_node_lost}

    def statuses(self) -> dict[str, str]:
        return {sid: live.status.value for sid, live in self._live.items()}

    async def aclose(self) -> None:
        for live in self._live.values():
            live.cancel.set()
        if self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
        if self._own_root and not self.settings.keep_workspaces:
            shutil.rmtree(self.workspace_root, ignore_errors=True)

    # ---- the session ------------------------------------------------------------------------------

    def _emit(self, live: _Live, **extra: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event({"type": "session", "session_id": live.spec.session_id, "task_id": live.spec.task_id,
                               "status": live.status.value, **extra})
            except Exception:
                log.exception("session event handler failed")

    def _set(self, live: _Live, status: SessionStatus) -> None:
        live.status = status
        self._emit(live)

    async def _run(self, live: _Live) -> SessionResult:
        with trace(live.spec.session_id):  # log lines of this session (and its tasks) carry its id as trace id
            return await self._run_traced(live)

    async def _run_traced(self, live: _Live) -> SessionResult:
        t0 = time.monotonic()
        deadline = t0 + self.settings.session_budget_s
        result = await self._attempt(live, deadline)
        while result is None:  # the node was lost: start again elsewhere
            live.new_attempt()
            result = await self._attempt(live, deadline)
        result.timings["total_s"] = round(time.monotonic() - t0, 3)
        live.status = result.status
        self._emit(live, reward=result.reward, error=result.error, node_id=result.node_id, attempts=result.attempts)
        return result

    async def _attempt(self, live: _Live, deadline: float) -> SessionResult | None:
        """One start of the session on one node; None when that node was lost and the session may start again."""
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._init(live)
                await self._harness(live)
        except TimeoutError:
            if live.waiting_for_node:
                live.error = self._no_node_message(live, f"the session budget of {self.settings.session_budget_s}s "
                                                         "ran out first")
                self.sessions_node_lost += bool(live.lost_nodes)
            else:
                live.budget_expired = True
        except _NoNode as e:
            live.error = str(e)
            self.sessions_node_lost += bool(live.lost_nodes)
        except Exception as e:
            live.error = f"session failed before POST_RUN: {type(e).__name__}: {e}"
            log.debug("session %s failed", live.spec.session_id, exc_info=True)
        try:
            return await self._post_run(live)
        except _NodeLost as e:
            return self._node_lost(live, str(e), deadline)
        except Exception as e:  # never let one session take the pipeline down
            log.exception("POST_RUN of %s failed", live.spec.session_id)
            return self._result(live, SessionStatus.ERROR, error=f"POST_RUN failed: {type(e).__name__}: {e}")
        finally:
            if live.node is not None:
                self.registry.release(live.node)
            if live.workspace is not None and not self.settings.keep_workspaces:
                shutil.rmtree(live.workspace, ignore_errors=True)

    def _node_lost(self, live: _Live, reason: str, deadline: float) -> SessionResult | None:
        """Re-dispatch (None) or, when retries or budget are spent, an ERROR result that says so."""
        assert live.node is not None
        node_id = live.node.node_id
        live.lost_nodes.append({"node_id": node_id, "reason": reason})
        if live.cancel.is_set():
            return self._result(live, SessionStatus.CANCELLED, error="cancelled")
        retries = self.settings.max_node_retries
        why = None
        if live.attempts > retries:
            why = (f"it was already re-dispatched {live.attempts - 1} time(s), the most max_node_retries={retries} "
                   "allows")
        elif time.monotonic() >= deadline:
            why = f"its session budget of {self.settings.session_budget_s}s is spent"
        if why is not None:
            self.sessions_node_lost += 1
            lost = ", ".join(f"{n['node_id']} ({n['reason']})" for n in live.lost_nodes)
            log.warning("session %s: gateway node %s lost and not re-dispatched: %s", live.spec.session_id, node_id, why)
            return self._result(live, SessionStatus.ERROR, error=(
                f"gateway node {node_id} was lost mid-session and the session was not re-dispatched: {why}. "
                f"Nodes lost: {lost}"))
        self.sessions_redispatched += 1
        log.warning("session %s: gateway node %s lost (%s); re-dispatching (attempt %d)", live.spec.session_id,
                    node_id, reason, live.attempts + 1)
        if self.on_event is not None:
            try:
                self.on_event({"type": "redispatch", "session_id": live.spec.session_id, "task_id": live.spec.task_id,
                               "node_id": node_id, "reason": reason, "attempt": live.attempts + 1})
            except Exception:
                log.exception("session event handler failed")
        return None

    def _no_node_message(self, live: _Live, why: str) -> str:
        if not live.lost_nodes:
            return f"no healthy gateway node with free capacity for this session: {why}"
        last = live.lost_nodes[-1]
        return (f"gateway node {last['node_id']} was lost mid-session ({last['reason']}) and no healthy gateway node "
                f"with free capacity took the session over: {why}")

    async def _acquire(self, live: _Live) -> GatewayNode | None:
        """The least-loaded healthy node with room, waiting up to ``node_wait_s`` for one (None if cancelled)."""
        wait_s = self.settings.node_wait_s
        give_up = time.monotonic() + wait_s
        pause = 0.05
        live.waiting_for_node = True
        try:
            while True:
                try:
                    return self.registry.pick()
                except GatewayError as e:
                    if time.monotonic() >= give_up:
                        raise _NoNode(self._no_node_message(live, f"none within node_wait_s={wait_s}s; {e}")) from None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(live.cancel.wait(), min(pause, max(0.0, give_up - time.monotonic())))
                if live.cancel.is_set():
                    return None
                pause = min(pause * 2, 0.5)
        finally:
            live.waiting_for_node = False

    async def _init(self, live: _Live) -> None:
        async with self.stages["init"].slot():
            if live.cancel.is_set():
                return
            t = time.monotonic()
            self._set(live, SessionStatus.INIT)
            live.node = await self._acquire(live)
            if live.node is None:
                return
            name = live.spec.session_id if live.attempts == 1 else f"{live.spec.session_id}-attempt{live.attempts}"
            ws = self.workspace_root / name
            if ws.exists():
                await asyncio.to_thread(shutil.rmtree, ws, True)
            if self.settings.template_dir:
                await asyncio.to_thread(shutil.copytree, self.settings.template_dir, ws, dirs_exist_ok=True)
            ws.mkdir(parents=True, exist_ok=True)
            live.workspace = ws
            live.timings["init_s"] = round(time.monotonic() - t, 3)

    async def _watch(self, live: _Live, stop: asyncio.Event) -> None:
        """Stop the harness when the session is cancelled or its node is lost: a harness retrying a dead
        gateway may otherwise hang until ``agent_timeout_s``."""
        assert live.node is not None
        interval_s = min(1.0, max(0.05, self.registry.heartbeat_timeout_s / 4))
        while not live.cancel.is_set():
            reason = self.registry.lost(live.node)
            if reason is not None:
                live.node_lost = reason
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.cancel.wait(), interval_s)
        stop.set()

    async def _harness(self, live: _Live) -> None:
        if live.cancel.is_set() or live.node is None:
            return
        async with self.stages["run"].slot():
            if live.cancel.is_set():
                return
            t = time.monotonic()
            self._set(live, SessionStatus.RUN)
            key = live.gateway_session
            # a secret key per attempt, and the session given to it before the harness starts: no other
            # session (which may learn this id) can create it first, read it, or write into it
            live.api_key = new_session_key(key)
            try:
                await self.registry.claim(live.node, key, live.api_key)
            except GatewayError as e:
                live.outcome = HarnessOutcome(error=f"could not reserve session {key} on gateway node "
                                                    f"{live.node.node_id}: {e}")
                return
            assert live.workspace is not None  # made by INIT, which acquired the node
            ctx = SessionContext(
                session_id=key, task=live.spec.task, workspace=live.workspace,
                gateway_url=live.node.url, api_key=live.api_key, model=self.settings.model_name,
            )
            stop = asyncio.Event()
            watcher = asyncio.ensure_future(self._watch(live, stop))
            try:
                live.outcome = await self.runner.run(ctx, self.settings.agent_timeout_s, stop)
            finally:
                watcher.cancel()
                live.timings["run_s"] = round(time.monotonic() - t, 3)

    async def _post_run(self, live: _Live) -> SessionResult:
        async with self.stages["post_run"].slot():
            t = time.monotonic()
            self._set(live, SessionStatus.POST_RUN)
            result = await self._finish(live)
            result.timings["post_run_s"] = round(time.monotonic() - t, 3)
            return result

    def _result(self, live: _Live, status: SessionStatus, **kw: Any) -> SessionResult:
        spec = live.spec
        return SessionResult(
            session_id=spec.session_id, task_id=spec.task_id, group_id=spec.group_id, sample_index=spec.sample_index,
            status=status, node_id=live.node.node_id if live.node else None, timings=dict(live.timings),
            metadata=dict(spec.metadata), attempts=live.attempts, lost_nodes=list(live.lost_nodes), **kw,
        )

    async def _records(self, live: _Live) -> list[CallRecord]:
        if live.node is None:
            return []
        try:
            return await asyncio.wait_for(self.registry.records(live.node, live.gateway_session, live.api_key), timeout=60)
        except Exception as e:
            gone = await self._node_gone(live)
            if gone is not None:
                raise _NodeLost(f"{gone}; the session's calls could not be read back") from e
            raise RuntimeError(f"could not read the session's calls from node {live.node.node_id}: {e}") from e

    async def _node_gone(self, live: _Live) -> str | None:
        """Why the session's node is gone (probing it if the registry still thinks it is up), or None."""
        if live.node is None:
            return None
        return self.registry.lost(live.node) or await self.registry.probe(live.node, self.settings.node_probe_timeout_s)

    def _samples(self, live: _Live, records: list[CallRecord]) -> tuple[list[TrajectorySample], dict[str, Any]]:
        from polar.trajectory import build

        samples, stats = build(records, self.settings.builder)
        versions = sorted({r.policy_version for r in records})
        for s in samples:
            s.group_id = live.spec.group_id
            s.metadata.update(task_id=live.spec.task_id, sample_index=live.spec.sample_index,
                              min_policy_version=versions[0] if versions else 0, **live.spec.metadata)
        return samples, stats

    async def _finish(self, live: _Live) -> SessionResult:
        out = live.outcome
        if live.node_lost is not None and not live.cancel.is_set():
            raise _NodeLost(live.node_lost)  # the harness was stopped; its calls on that node are not readable
        records = await self._records(live)
        samples, stats = self._samples(live, records) if records else ([], {})
        incomplete = [r for r in records if not r.complete or r.error]
        common = dict(output=out.output if out else "", num_calls=len(records), samples=samples, builder_stats=stats)
        for s in samples:
            s.metadata["session_status"] = "pending"

        def finish(status: SessionStatus, reward: float | None = None, error: str | None = None,
                   verifier_output: dict[str, Any] | None = None, trainable: bool = False) -> SessionResult:
            if not trainable:
                mask_out(samples)
            for s in samples:
                s.reward = reward
                s.metadata["session_status"] = status.value
            return self._result(live, status, reward=reward, error=error, verifier_output=verifier_output or {}, **common)

        if live.cancel.is_set() and (out is None or out.cancelled or out.returncode is None):
            return finish(SessionStatus.CANCELLED, error="cancelled")
        failed = out is not None and not (out.timed_out or out.cancelled) and (
            out.error or not records or len(incomplete) == len(records))
        if failed and not live.budget_expired:
            gone = await self._node_gone(live)  # calls to a dead gateway fail; that is the node's fault, not the harness's
            if gone is not None:
                raise _NodeLost(gone)
        if live.error:
            return finish(SessionStatus.ERROR, error=live.error)
        if live.budget_expired or (out is not None and out.timed_out):
            why = (f"session budget of {self.settings.session_budget_s}s ran out" if live.budget_expired
                   else f"agent timed out after {self.settings.agent_timeout_s}s")
            complete = bool(records) and not incomplete
            why += "" if complete else "; token data incomplete, fully masked"
            if out is not None and out.stderr_tail:  # the harness's last output lines say where it was stuck
                why += f". Last output:\n{out.stderr_tail[-2000:]}"
            return finish(SessionStatus.TIMEOUT, reward=0.0, error=why, trainable=complete)
        if out is None:
            return finish(SessionStatus.ERROR, error="the harness never ran")
        if out.error:
            return finish(SessionStatus.ERROR, error=out.error)
        if not records:
            return finish(SessionStatus.ERROR, error=(
                "the harness made no model calls through the gateway for this session; it must use the "
                "injected OPENAI_BASE_URL/OPENAI_API_KEY (or ANTHROPIC_*/GEMINI_*) — the API key names the session"))
        if len(incomplete) == len(records):
            return finish(SessionStatus.ERROR, error=f"every model call failed; first: {incomplete[0].error or 'no token data'}")
        try:
            verdict = await asyncio.wait_for(
                self.verifier(VerifyInput(task=live.spec.task, output=out.output, workspace=live.workspace or Path("."),
                                          records=records, harness=out.details)),
                timeout=self.settings.verifier_timeout_s,
            )
        except asyncio.TimeoutError:
            return finish(SessionStatus.ERROR, error=f"verifier timed out after {self.settings.verifier_timeout_s}s")
        except Exception as e:
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            return finish(SessionStatus.ERROR, error=f"verifier raised: {tb}")
        details = dict(verdict.details)
        if incomplete:
            details["masked"] = f"{len(incomplete)} call(s) without complete token data; session fully masked"
        return finish(SessionStatus.DONE, reward=float(verdict.reward), verifier_output=details, trainable=not incomplete)
