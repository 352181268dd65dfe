"""``distribution.backend: local``: rollouts on this machine.

- ``rollout_workers: 0``: the envs are stepped in the learner process with the learner's own policy
  object (no copies, no IPC). For cheap envs on few cores this is the fastest layout.
- ``rollout_workers: K``: K worker processes (forkserver), each stepping ``envs_per_worker`` copies
  with one batched forward. Weights live in shared-memory tensors guarded by a lock and a version
  counter; each worker hands fragments back through two shared-memory slots, so the learner takes
  the first-ready fragment and a slow worker never holds the others up. ``start()`` returns once
  every worker is up (its envs built, a first fragment collected), so a worker that starts slowly
  still takes part from the first update, and one that cannot start fails the run at start.
- ``on_policy=True`` (PPO's row in ``polar.trainers.registry``): each worker has one slot, takes it back
  only when the next weights are published, and loads them before it collects again. Every fragment of
  an update is then collected with the weights of the update before (policy lag 0), as PPO's ratio and
  advantages assume; with two slots and no wait a worker ran up to 2 fragments ahead, and PPO trained
  on fragments 1-2 updates old, which cost it env steps (docs/benchmarks.md, "Default kwargs vs
  Stable-Baselines3").
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import time
from collections import deque
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from polar import errors
from polar.errors import HarnessError, PolarError
from polar.metrics.system import register_process
from polar.types import Fragment

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

    from polar.config.run import EnvRunConfig
    from polar.models.policy import Policy
    from polar.rollout.runner import EnvRunner

#: What a worker puts on the out queue: ("slots", id, slots) | ("fragment", id, slot, meta) | ("error", id, ...).
WorkerMessage = tuple[Any, ...]

log = logging.getLogger(__name__)


class LocalBackend:
    def __init__(self, cfg: EnvRunConfig, fragment_steps: int, seed: int, config_dir: Path | None = None,
                 on_policy: bool = False) -> None:
        from polar.harness import make_vector_env

        self.cfg = cfg
        self.fragment_steps = fragment_steps
        self.seed = seed
        self.on_policy = on_policy
        self._held: list[tuple[int, int]] = []  # on_policy: (worker, slot) read since the last publish
        self.config_dir = config_dir if config_dir is not None else cfg.config_dir
        dist = cfg.distribution
        if dist.coordinator_address is not None:
            log.debug("distribution.coordinator_address=%r is ignored by the local backend", dist.coordinator_address)
        self.num_workers = dist.rollout_workers
        self.envs_per_worker = dist.envs_per_runner
        self.num_envs = dist.num_envs
        self.runner: EnvRunner | None = None
        self.version = 0
        self._procs: list[BaseProcess] = []
        self._unread: deque[WorkerMessage] = deque()  # fragment messages that arrived while start() waited for the others
        self._closed = False
        self.env: VectorEnv | None
        if self.num_workers == 0:
            self.env = make_vector_env(cfg.harness, self.envs_per_worker, seed=seed, config_dir=self.config_dir)
        else:
            cpus = mp.cpu_count()
            if self.num_workers > cpus:
                log.warning("distribution.rollout_workers=%d exceeds the %d CPU cores here; workers will time-share.",
                            self.num_workers, cpus)
            self.env = make_vector_env(cfg.harness, 1, seed=seed, config_dir=self.config_dir)  # probe for spaces
        assert self.env is not None
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        if self.num_workers > 0:
            self.env.close()
            self.env = None

    # ------------------------------------------------------------------ protocol
    def start(self, policy_state: dict[str, torch.Tensor], version: int = 0, policy: Policy | None = None) -> None:
        if self.num_workers == 0:
            from polar.rollout.runner import EnvRunner, runner_options

            if policy is None or self.env is None:
                raise ValueError("LocalBackend with rollout_workers=0 needs the learner's policy object")
            self.runner = EnvRunner(self.env, policy, seed=self.seed, **runner_options(self.cfg))
            self.version = version
            return
        from polar.rollout.worker import worker_main

        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "polar.rollout.worker", "polar.rollout.runner"])
        self._weights = {k: v.detach().clone().share_memory_() for k, v in policy_state.items()}
        self._version = ctx.Value("q", version)
        self._lock = ctx.Lock()
        self._stop = ctx.Event()
        self._out_q = ctx.Queue()
        # only this process holds the write end: its EOF tells the workers the learner is gone (polar.lifetime)
        learner_alive, self._alive_w = ctx.Pipe(duplex=False)
        self._free_qs: list[Any] = []  # per worker: a multiprocessing queue of its free slot indices
        self._slots: dict[int, list[dict[str, torch.Tensor]]] = {}  # per worker: its two shared-memory slots
        cfg_data = self.cfg.model_dump(mode="json")
        cdir = str(self.config_dir) if self.config_dir is not None else None
        for w in range(self.num_workers):
            free_q = ctx.Queue()
            for slot in range(1 if self.on_policy else 2):
                free_q.put(slot)
            self._free_qs.append(free_q)
            seed = self.seed + 7919 * (w + 1)
            p = ctx.Process(target=worker_main, name=f"polar-rollout-{w}", daemon=True,
                            args=(w, cfg_data, cdir, seed, self.fragment_steps, self._weights, self._version,
                                  self._lock, self._out_q, free_q, self._stop, learner_alive),
                            kwargs={"run_dir": os.environ.get("POLAR_RUN_DIR"),  # set by the learner's loop
                                    "on_policy": self.on_policy})
            p.start()
            assert p.pid is not None  # started
            register_process(p.pid, "rollout_worker")  # its system/ metrics carry the role
            self._procs.append(p)
        learner_alive.close()
        try:
            self._wait_until_all_started(self.cfg.distribution.worker_timeout_s)
        except BaseException:
            self.close()
            raise
        log.info("started %d rollout workers x %d envs", self.num_workers, self.envs_per_worker)

    def _wait_until_all_started(self, timeout_s: float) -> None:
        """Every worker announces its shared-memory slots once its first fragment is collected. Fragments
        that arrive meanwhile wait unread, holding their slots, so a fast worker runs at most 2 ahead (on_policy:
        none runs ahead)."""
        deadline = time.monotonic() + timeout_s
        while len(self._slots) < self.num_workers:
            missing = self.num_workers - len(self._slots)
            msg = self._next_message(deadline, timeout_s, f"the start of {missing} of {self.num_workers} rollout "
                                     "workers (envs built, first fragment collected)")
            if msg[0] == "fragment":
                self._unread.append(msg)
            else:
                self._read(msg)

    def publish_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        if self.num_workers == 0:
            self.version = version  # the runner acts with the learner's own tensors
            return
        with self._lock:
            for k, t in self._weights.items():
                t.copy_(state_dict[k])
            self._version.value = version
        for wid, slot in self._held:  # on_policy: the workers of the last batch collect again, with these weights
            self._free_qs[wid].put(slot)
        self._held.clear()

    def next_fragment(self, timeout_s: float | None = None) -> Fragment:
        if self.num_workers == 0:
            if self.runner is None:
                raise RuntimeError("the local rollout backend is not started; call start() first")
            return self.runner.collect(self.fragment_steps, self.version, 0)
        while self._unread:  # fragments that arrived while start() waited: the oldest first
            unread = self._read(self._unread.popleft())
            if unread is not None:
                return unread
        timeout_s = timeout_s if timeout_s is not None else self.cfg.distribution.worker_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._next_message(deadline, timeout_s, f"a rollout fragment from any of {self.num_workers} workers")
            frag = self._read(msg)
            if frag is not None:
                return frag

    def _next_message(self, deadline: float, timeout_s: float, what: str) -> WorkerMessage:
        while True:
            try:
                return self._out_q.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise HarnessError(
                        f"no sign of {what} within {timeout_s:.0f}s; a worker or its env is stuck "
                        "(raise distribution.worker_timeout_s if steps are really this slow)."
                    ) from None

    def _read(self, msg: WorkerMessage) -> Fragment | None:
        """A worker's message: a fragment (its slot freed for the next one), None for its slots, or its error."""
        kind = msg[0]
        if kind == "slots":
            self._slots[msg[1]] = msg[2]
            return None
        if kind == "fragment":
            _, wid, slot, meta = msg
            from polar.rollout.worker import fragment_from_arrays

            arrays = {k: t.numpy().copy() for k, t in self._slots[wid][slot].items()}
            if self.on_policy:
                self._held.append((wid, slot))  # freed by the next publish_weights
            else:
                self._free_qs[wid].put(slot)
            return fragment_from_arrays(arrays, meta)
        _, wid, etype, message, tb = msg  # "error"
        cls = getattr(errors, etype, None)
        text = f"rollout worker {wid} failed: {message}"
        if isinstance(cls, type) and issubclass(cls, PolarError):
            raise cls(text)
        raise HarnessError(f"rollout worker {wid} failed with {etype}: {message}\n{tb}")

    def _check_alive(self) -> None:
        for i, p in enumerate(self._procs):
            if not p.is_alive() and not self._stop.is_set():
                raise HarnessError(f"rollout worker {i} (pid {p.pid}) died with exit code {p.exitcode}; see its log above.")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.num_workers == 0:
            if self.env is not None:
                self.env.close()
            return
        self._stop.set()
        deadline = time.monotonic() + 10.0
        for p in self._procs:
            while p.is_alive() and time.monotonic() < deadline:
                try:  # drain so workers blocked on a full pipe can exit
                    self._out_q.get(timeout=0.05)
                except queue.Empty:
                    pass
                p.join(timeout=0.05)
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
        self._alive_w.close()
        self._out_q.cancel_join_thread()
