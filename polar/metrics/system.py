"""System metrics per process: CPU%, RSS, I/O bytes, threads; the host's CPU, memory and network; GPUs via NVML.

A :class:`SystemSampler` runs a daemon thread in the learner process. Every ``interval_s`` it walks the
process tree below it (rollout workers, connector processes, engine replicas, agent CLIs) and keeps the
latest snapshot; the training loop merges :meth:`SystemSampler.snapshot` into each metrics row, so the
numbers land in ``metrics.jsonl`` and TensorBoard as ``system/<proc>/<field>`` (docs/evaluation.md).

A process's role comes from :func:`register_process` (in this process), else its ``POLAR_ROLE``
environment variable, else its command line. NVML (``nvidia-ml-py``) is used only when it imports and
finds a GPU; without it there are no ``system/gpu*`` keys.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil

log = logging.getLogger(__name__)

MiB = 1024 * 1024
_registered: dict[int, str] = {}
_lock = threading.Lock()

# (substring of the command line, role), first match wins
_CMDLINE_ROLES = (
    ("polar.harness.connector", "connector"),
    ("vllm", "engine_replica"),
    ("sglang", "engine_replica"),
    ("polar gateway", "gateway"),
    ("multiprocessing.forkserver", "forkserver"),
    ("multiprocessing.resource_tracker", "resource_tracker"),
    ("multiprocessing.spawn", "rollout_worker"),
    ("ray::", "ray_actor"),
)


def register_process(pid: int, role: str) -> None:
    """Name the role of a process this one started (``rollout_worker``, ``connector``, ``engine_replica``...)."""
    with _lock:
        _registered[int(pid)] = role


def role_of(proc: psutil.Process) -> str:
    """The role of a ``psutil.Process``: registered, else ``POLAR_ROLE`` in its environment, else its command line."""
    with _lock:
        role = _registered.get(proc.pid)
    if role:
        return role
    try:
        env_role = proc.environ().get("POLAR_ROLE")
    except Exception:  # AccessDenied, a process gone, platforms without environ
        env_role = None
    if env_role:
        return env_role
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:
        cmd = ""
    for needle, r in _CMDLINE_ROLES:
        if needle in cmd:
            return r
    return "child"


class _Nvml:
    """NVML handles, or nothing when ``pynvml`` is absent or finds no GPU (never an error)."""

    def __init__(self) -> None:
        self.handles: list[object] = []  # opaque NVML device handles
        self.nv: ModuleType | None = None  # pynvml once it initialised
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.nv = pynvml
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, no driver
            log.debug("no NVML GPU metrics: %s", e)

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        nv = self.nv
        if nv is None:
            return out
        for i, h in enumerate(self.handles):
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            except Exception as e:  # a GPU lost mid-run: say it once per sample, keep the others
                log.debug("NVML sample of GPU %d failed: %s", i, e)
                continue
            out[f"system/gpu{i}/util_percent"] = float(util.gpu)
            out[f"system/gpu{i}/mem_used_mb"] = mem.used / MiB
            out[f"system/gpu{i}/mem_total_mb"] = mem.total / MiB
        return out


class SystemSampler:
    """Samples this process (``role``) and its descendants every ``interval_s`` on a daemon thread.

    ``snapshot()`` returns the latest sample (``{}`` before the first one completes); ``sample()`` takes
    one now, on the caller's thread. CPU% is measured between consecutive samples.
    """

    def __init__(self, role: str = "learner", interval_s: float = 5.0, pid: int | None = None,
                 gpu: bool = True) -> None:
        import psutil

        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 seconds (got {interval_s})")
        self.role, self.interval_s = role, float(interval_s)
        self.root = psutil.Process(pid or os.getpid())
        self._procs: dict[int, psutil.Process] = {}  # pid -> psutil.Process, kept so cpu_percent has a previous reading
        self._names: dict[int, str] = {}  # pid -> stable "<role>-<n>" while the process lives
        self._cmdlines: dict[int, tuple[str, ...]] = {}  # pid -> the command line its name was given for
        self._latest: dict[str, float] = {}
        self._nvml = _Nvml() if gpu else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sample_lock = threading.Lock()
        psutil.cpu_percent(None)  # the host's first reading: the next one is measured from here

    # ------------------------------------------------------------------ naming
    def _name(self, proc: psutil.Process) -> str:
        # a child caught between fork and exec still shows its parent's command line (or none): named then,
        # a connector would stay "rollout_worker-2" or "child-0" for life, so an exec renames the process
        try:
            cmdline = tuple(proc.cmdline())
        except Exception:  # AccessDenied, gone: keep what it was called
            cmdline = self._cmdlines.get(proc.pid, ())
        if self._cmdlines.get(proc.pid) != cmdline:
            self._names.pop(proc.pid, None)
            self._cmdlines[proc.pid] = cmdline
        name = self._names.get(proc.pid)
        if name is None:
            role = self.role if proc.pid == self.root.pid else role_of(proc)
            if proc.pid == self.root.pid:
                name = role
            else:  # the lowest index no live process of the role holds: keys stay few and stable across restarts
                taken = set(self._names.values())
                n = 0
                while f"{role}-{n}" in taken:
                    n += 1
                name = f"{role}-{n}"
            self._names[proc.pid] = name
        return name

    # ------------------------------------------------------------------ sampling
    def sample(self) -> dict[str, float]:
        import psutil

        with self._sample_lock:
            try:
                live = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                live = []
            out: dict[str, float] = {}
            seen = {p.pid for p in live}
            for pid in list(self._procs):  # gone since the last sample: their names are free again
                if pid not in seen:
                    self._procs.pop(pid)
                    self._names.pop(pid, None)
                    self._cmdlines.pop(pid, None)
            for p in live:
                proc = self._procs.setdefault(p.pid, p)
                try:
                    with proc.oneshot():
                        cpu = proc.cpu_percent(None)
                        rss = proc.memory_info().rss
                        threads = proc.num_threads()
                        try:
                            io = proc.io_counters()
                            io_r, io_w = getattr(io, "read_chars", io.read_bytes), getattr(io, "write_chars", io.write_bytes)
                        except (psutil.AccessDenied, AttributeError, NotImplementedError):
                            io_r = io_w = None
                except psutil.Error:  # exited between the walk and the read
                    continue
                key = f"system/{self._name(proc)}"
                out[f"{key}/cpu_percent"] = float(cpu)
                out[f"{key}/rss_mb"] = rss / MiB
                out[f"{key}/threads"] = float(threads)
                if io_r is not None:
                    out[f"{key}/io_read_mb"] = io_r / MiB
                    out[f"{key}/io_write_mb"] = io_w / MiB
            out["system/processes"] = float(len(seen))
            out["system/host/cpu_percent"] = float(psutil.cpu_percent(None))
            out["system/host/mem_used_mb"] = psutil.virtual_memory().used / MiB
            try:
                net = psutil.net_io_counters()
                out["system/host/net_sent_mb"] = net.bytes_sent / MiB
                out["system/host/net_recv_mb"] = net.bytes_recv / MiB
            except Exception:  # containers without /proc/net/dev
                pass
            if self._nvml is not None:
                out.update(self._nvml.sample())
            self._latest = out
            return out

    def snapshot(self) -> dict[str, float]:
        """The latest sample (a copy); ``{}`` before the first."""
        return dict(self._latest)

    # ------------------------------------------------------------------ thread
    def start(self) -> SystemSampler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="polar-system-sampler", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # never let metrics kill a run
                log.exception("system metrics sample failed")
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 5.0)
            self._thread = None

    def __enter__(self) -> SystemSampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class StageTimer:
    """Seconds per stage since the last ``pop()``: ``with timer.stage("collect"): ...`` then
    ``row.update(timer.pop())`` gives ``time/collect_s`` (docs/evaluation.md)."""

    def __init__(self) -> None:
        self._acc: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        self._acc[stage] = self._acc.get(stage, 0.0) + float(seconds)

    def stage(self, name: str) -> _Stage:
        return _Stage(self, name)

    def pop(self) -> dict[str, float]:
        out = {f"time/{k}_s": v for k, v in self._acc.items()}
        self._acc = {}
        return out


class _Stage:
    def __init__(self, timer: StageTimer, name: str) -> None:
        self.timer, self.name = timer, name

    def __enter__(self) -> _Stage:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.timer.add(self.name, time.perf_counter() - self.t0)
