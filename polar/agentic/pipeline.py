"""The session pipeline: INIT → RUN → POST_RUN → DONE | ERROR | TIMEOUT (| CANCELLED).

Each stage has its own worker pool (a semaphore), so preparing workspaces and verifying finished
sessions overlap with running harnesses. A session has a wall-clock budget over all stages; the harness
has its own (shorter) agent timeout. Whatever happens, POST_RUN still collects the calls the session
made, so a timed-out session yields them (reward 0, trainable only if every call's token data is
complete), and an ERROR session keeps them for inspection with every loss mask zeroed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.agentic.nodes import GatewayNode, NodeRegistry
from polar.agentic.runners import HarnessOutcome, HarnessRunner, SessionContext
from polar.agentic.session import SessionResult, SessionSpec, SessionStatus, mask_out
from polar.agentic.verifiers import VerifyInput
from polar.types import CallRecord

log = logging.getLogger(__name__)

STAGES = ("init", "run", "post_run")


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


class _Stage:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.sem = asyncio.Semaphore(workers)
        self.active = 0
        self.waiting = 0

    @contextlib.asynccontextmanager
    async def slot(self):
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
        self.node: GatewayNode | None = None
        self.workspace: Path | None = None
        self.outcome: HarnessOutcome | None = None
        self.error: str | None = None
        self.budget_expired = False
        self.timings: dict[str, float] = {}


class SessionPipeline:
    """Runs sessions on an asyncio loop. ``submit`` returns a task resolving to a :class:`SessionResult`."""

    def __init__(self, runner: HarnessRunner, verifier: Any, registry: NodeRegistry, settings: PipelineSettings,
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
        self._tasks: dict[str, asyncio.Task] = {}
        root = settings.workspace_root
        self._own_root = root is None
        self.workspace_root = Path(root) if root else Path(tempfile.mkdtemp(prefix="polar-sessions-"))
        self.workspace_root.mkdir(parents=True, exist_ok=True)

    # ---- public API ------------------------------------------------------------------------------

    def submit(self, spec: SessionSpec) -> asyncio.Task:
        if spec.session_id in self._live:
            raise ValueError(f"session {spec.session_id!r} is already running")
        live = _Live(spec)
        self._live[spec.session_id] = live
        task = asyncio.ensure_future(self._run(live))
        self._tasks[spec.session_id] = task
        task.add_done_callback(lambda _t, sid=spec.session_id: (self._live.pop(sid, None), self._tasks.pop(sid, None)))
        return task

    def cancel(self, session_id: str) -> bool:
        live = self._live.get(session_id)
        if live is None:
            return False
        live.cancel.set()  # RUN notices this and kills the harness; other stages check it at boundaries
        return True

    def load(self) -> dict[str, Any]:
        return {name: stage.load() for name, stage in self.stages.items()} | {"sessions": len(self._live)}

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
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.settings.session_budget_s):
                await self._init(live)
                await self._harness(live)
        except TimeoutError:
            live.budget_expired = True
        except Exception as e:
            live.error = f"session failed before POST_RUN: {type(e).__name__}: {e}"
            log.debug("session %s failed", live.spec.session_id, exc_info=True)
        try:
            result = await self._post_run(live)
        except Exception as e:  # never let one session take the pipeline down
            log.exception("POST_RUN of %s failed", live.spec.session_id)
            result = self._result(live, SessionStatus.ERROR, error=f"POST_RUN failed: {type(e).__name__}: {e}")
        finally:
            if live.node is not None:
                self.registry.release(live.node)
            if live.workspace is not None and not self.settings.keep_workspaces:
                shutil.rmtree(live.workspace, ignore_errors=True)
        result.timings["total_s"] = round(time.monotonic() - t0, 3)
        live.status = result.status
        self._emit(live, reward=result.reward, error=result.error)
        return result

    async def _init(self, live: _Live) -> None:
        async with self.stages["init"].slot():
            if live.cancel.is_set():
                return
            t = time.monotonic()
            self._set(live, SessionStatus.INIT)
            live.node = self.registry.pick()
            ws = self.workspace_root / live.spec.session_id
            if self.settings.template_dir:
                await asyncio.to_thread(shutil.copytree, self.settings.template_dir, ws, dirs_exist_ok=True)
            ws.mkdir(parents=True, exist_ok=True)
            live.workspace = ws
            live.timings["init_s"] = round(time.monotonic() - t, 3)

    async def _harness(self, live: _Live) -> None:
        if live.cancel.is_set() or live.node is None:
            return
        async with self.stages["run"].slot():
            if live.cancel.is_set():
                return
            t = time.monotonic()
            self._set(live, SessionStatus.RUN)
            ctx = SessionContext(
                session_id=live.spec.session_id, task=live.spec.task, workspace=live.workspace,
                gateway_url=live.node.url, api_key=live.spec.session_id, model=self.settings.model_name,
            )
            try:
                live.outcome = await self.runner.run(ctx, self.settings.agent_timeout_s, live.cancel)
            finally:
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
            metadata=dict(spec.metadata), **kw,
        )

    async def _records(self, live: _Live) -> list[CallRecord]:
        if live.node is None:
            return []
        try:
            return await asyncio.wait_for(self.registry.records(live.node, live.spec.session_id), timeout=60)
        except Exception as e:
            raise RuntimeError(f"could not read the session's calls from node {live.node.node_id}: {e}") from e

    def _samples(self, live: _Live, records: list[CallRecord]) -> tuple[list[Any], dict[str, Any]]:
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
                "injected OPENAI_BASE_URL/OPENAI_API_KEY (or ANTHROPIC_*/GEMINI_*) — the API key is the session id"))
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
