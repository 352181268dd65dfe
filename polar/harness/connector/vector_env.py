"""Connector-backed environments: a SAME_STEP-autoreset ``VectorEnv`` and a single ``gymnasium.Env``.

The vector env produces exactly what ``gymnasium.vector.SyncVectorEnv(autoreset_mode=SAME_STEP)``
does (``infos["final_obs"]``, ``infos["final_info"]`` and their ``_`` masks), so learners treat both
alike. A connector process that dies or hangs is restarted; every episode it interrupted ends as
``truncated`` with ``info["polar/connector_restart"] = True`` and its last known observation as
``final_obs``. Episodes that finished before the failure were already delivered, so none is lost.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from polar.errors import EnvContractError, PolarError, ProtocolError
from polar.harness.connector.process import ConnectorProcess, ProcessFailed, derive_seed
from polar.harness.connector.shm import SharedReply
from polar.harness.connector.spaces import (
    array_mismatch,
    conform,
    index,
    infer_space,
    shape_mismatch,
    space_bytes,
    space_from_wire,
)

if TYPE_CHECKING:
    from polar.config.harness import ConnectorSpec

log = logging.getLogger("polar.connector")
RESTART_KEY = "polar/connector_restart"


def _concat(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], dict):
        return {k: _concat([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


def _slice(batched: Any, lo: int, hi: int) -> Any:
    if isinstance(batched, dict):
        return {k: _slice(v, lo, hi) for k, v in batched.items()}
    return batched[lo:hi]


class ConnectorVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` copies of a connector, ``copies_per_process`` per process, stepped in one round trip each."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, spec: ConnectorSpec, num_envs: int, seed: int | None = None, config_dir: Path | None = None,
                 worker_index: int = 0) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        per = spec.copies_per_process or num_envs
        sizes = [min(per, num_envs - lo) for lo in range(0, num_envs, per)]
        self.num_envs = num_envs
        self._bounds = [(lo, lo + n) for lo, n in zip(np.cumsum([0, *sizes[:-1]]).tolist(), sizes, strict=False)]
        self.procs: list[ConnectorProcess] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pending_seed = seed
        self._run_seed = seed  # per-copy config seeds and post-restart reset seeds derive from it
        self.worker_index = worker_index
        self._first_reset = True
        self._last_obs: Any = None
        self._warned_no_final_obs = False
        self.closed = False
        try:
            for j, n in enumerate(sizes):
                self.procs.append(ConnectorProcess(spec, n, config_dir, index=j, worker_index=worker_index,
                                                   vector_offset=self._bounds[j][0], seed=seed))
            for p in self.procs:  # boot them in parallel
                p.spawn()
            for p in self.procs:
                try:
                    p.connect()
                except ProcessFailed as e:
                    from polar.errors import ConnectorStartError

                    raise ConnectorStartError(f"{p.name} failed to start: {e}.{p.tail_text()}") from None
            self._init_spaces(self.procs[0].describe)
        except BaseException:
            self._close_procs()
            raise
        self.name = self.procs[0].name
        if spec.heartbeat_interval_s > 0:  # a weak reference: an env dropped without close() can still be collected
            threading.Thread(target=_heartbeat_loop, args=(weakref.ref(self), self._stop, spec.heartbeat_interval_s,
                                                           spec.call_timeout_s),
                             daemon=True, name="polar-connector-heartbeat").start()

    # ------------------------------------------------------------------------------- spaces
    def _init_spaces(self, desc: dict) -> None:
        name = self.procs[0].name  # the declared class name, made printable
        if desc.get("multi_agent"):
            from polar.errors import ConfigError

            raise ConfigError(f"{name} is a multi-agent connector (its init reply says multi_agent: true); run it with "
                              "harness: {type: pettingzoo, connector_spec: ...} (docs/multi-agent.md)")
        self.single_action_space = space_from_wire(desc.get("action_space"), f"{name}.action_space")
        if desc.get("observation_space") is not None:
            self.single_observation_space = space_from_wire(desc["observation_space"], f"{name}.observation_space")
        else:  # inferred from the first observation
            reply = self.procs[0].call({"op": "reset", "seeds": None, "env_ids": [0]})
            self.single_observation_space = infer_space(index(reply["obs"], 0), f"{name}.reset() observation")
        obs_bytes = space_bytes(self.single_observation_space)
        for p in self.procs:  # compressed replies decode to the declared observations, not to what a header claims
            p.set_observation_bytes(obs_bytes)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    @property
    def restarts(self) -> int:
        """Connector process restarts so far (all processes)."""
        return sum(p.restarts for p in self.procs)

    @property
    def copies_restarted(self) -> int:
        """Env copies whose process was restarted, summed over restarts (a 4-copy process restarted 3 times: 12)."""
        return sum(p.restarts * p.num_envs for p in self.procs)

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self.procs]

    # ------------------------------------------------------------------------------- reset
    def _seeds(self, seed: int | list | None) -> list:
        first = self._first_reset
        self._first_reset = False
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed
        self._pending_seed = None
        if seed is None and first and self.num_envs > 1 and self.procs[0].describe.get("reset_accepts_seed"):
            # like Gymnasium's vector envs: unseeded copies still start from distinct random streams
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"reset(seed=list) needs {self.num_envs} seeds, got {len(seed)}")
        return list(seed)

    def reset_raw(self, seed: int | list | None = None) -> tuple[Any, list[dict]]:
        seeds = self._seeds(seed)
        with self._lock:
            received: dict[int, dict[str, Any]] = {}
            pending = list(range(len(self.procs)))
            while pending:
                for j in pending:
                    lo, hi = self._bounds[j]
                    try:
                        self.procs[j].send({"op": "reset", "seeds": seeds[lo:hi], "env_ids": None})
                    except ProcessFailed:
                        pass  # the receive below reports it
                failed, error = [], None
                for j in pending:
                    try:
                        received[j] = self.procs[j].receive()
                    except ProcessFailed as e:
                        self.procs[j].recover(str(e))
                        failed.append(j)
                    except PolarError as e:  # drain every other reply first, so the streams stay in step
                        error = error or e
                if error is not None:
                    raise error
                pending = failed
        replies = [received[j] for j in range(len(self.procs))]
        for j, r in enumerate(replies):
            self._check_obs(j, "reset", r)
        obs = conform(_concat([r["obs"] for r in replies]), self.single_observation_space)
        infos = [info for j, r in enumerate(replies) for info in (r.get("infos") or [{}] * self._size(j))]
        self._last_obs = obs
        return obs, infos

    def reset(self, *, seed: int | list | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if options:
            raise ValueError("connector envs take no reset options; put settings in connector_spec.config")
        obs, per_env = self.reset_raw(seed)
        infos: dict = {}
        for i, info in enumerate(per_env):
            if info:
                infos = self._add_info(infos, info, i)
        return obs, infos

    # ------------------------------------------------------------------------------- step
    def _check_actions(self, actions: Any) -> Any:
        space = self.single_action_space
        if isinstance(space, spaces.Discrete):
            arr = np.asarray(actions)
            if arr.shape != (self.num_envs,) or arr.dtype.kind not in "iub":
                if arr.dtype.kind == "f" and arr.shape == (self.num_envs,) and np.all(arr == np.round(arr)):
                    arr = arr.astype(np.int64)
                else:
                    raise EnvContractError(
                        f"actions for {self.name}: expected {self.num_envs} integers for {space} (shape "
                        f"({self.num_envs},)), got shape {arr.shape} dtype {arr.dtype}"
                    )
            lo, hi = space.start, space.start + space.n
            if arr.size and (arr.min() < lo or arr.max() >= hi):
                raise EnvContractError(f"actions for {self.name}: values must lie in [{lo}, {hi}) for {space}, got {arr.tolist()}")
            return arr.astype(np.int64, copy=False)
        if isinstance(space, spaces.Dict):
            if not isinstance(actions, dict) or set(actions) != set(space.spaces):
                raise EnvContractError(f"actions for {self.name}: expected a dict with keys {sorted(space.spaces)}")
            return actions
        arr = np.asarray(actions)
        want = (self.num_envs, *space.shape)
        if arr.shape != want:
            raise EnvContractError(f"actions for {self.name}: expected shape {want} for {space}, got {arr.shape}")
        if isinstance(space, spaces.Box):
            if arr.dtype.kind not in "biuf":
                raise EnvContractError(f"actions for {self.name}: expected numbers for {space}, got dtype {arr.dtype}")
            return arr.astype(space.dtype, copy=False)
        if not all(space.contains(a) for a in arr.astype(space.dtype)):
            raise EnvContractError(f"actions for {self.name}: some action is outside {space}: {arr.tolist()}")
        return arr.astype(space.dtype, copy=False)

    def step_raw(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list, list | None, list | None]:
        """Step every copy; per-env infos, final obs and final infos as lists (None where not done)."""
        obs, rewards, terminated, truncated, infos, final_obs, final_infos = self._step(actions)
        return obs, rewards, terminated, truncated, infos or [{}] * self.num_envs, final_obs, final_infos

    def _step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list | None, list | None, list | None]:
        """``step_raw`` with ``None`` for per-env infos when every copy's is empty."""
        actions = self._check_actions(actions)
        single = len(self.procs) == 1
        with self._lock:
            for j, p in enumerate(self.procs):
                lo, hi = self._bounds[j]
                try:
                    p.send({"op": "step", "actions": actions if single else _slice(actions, lo, hi)})
                except ProcessFailed:
                    pass  # the receive below reports it
            replies: list = []
            failed: list[tuple[int, str]] = []
            error: Exception | None = None
            for j, p in enumerate(self.procs):
                try:
                    replies.append(p.receive())
                    p.mark_healthy_step()
                except ProcessFailed as e:
                    replies.append(None)
                    failed.append((j, str(e)))
                except PolarError as e:  # drain every other reply first, so the streams stay in step
                    replies.append(None)
                    error = error or e
            for j, reason in failed:
                replies[j] = self._restart(j, reason)
            if error is not None:
                raise error
        for j, r in enumerate(replies):
            if type(r) is not SharedReply:  # the mapping's layout fixes its shapes
                self._check_step(j, r)
        if single:
            r = replies[0]
            obs = conform(r["obs"], self.single_observation_space)
            rewards, terminated, truncated = r["rewards"], r["terminated"], r["truncated"]
            infos, final_obs, final_infos = r.get("infos"), r.get("final_obs"), r.get("final_infos")
        else:
            obs = conform(_concat([r["obs"] for r in replies]), self.single_observation_space)
            rewards = np.concatenate([r["rewards"] for r in replies])
            terminated = np.concatenate([r["terminated"] for r in replies])
            truncated = np.concatenate([r["truncated"] for r in replies])
            infos = final_obs = final_infos = None
            if any(r.get("infos") for r in replies):
                infos = [i for j, r in enumerate(replies) for i in (r.get("infos") or [{}] * self._size(j))]
            if any(r.get("final_obs") for r in replies):
                final_obs = [o for j, r in enumerate(replies) for o in (r.get("final_obs") or [None] * self._size(j))]
                final_infos = [o for j, r in enumerate(replies) for o in (r.get("final_infos") or [None] * self._size(j))]
        if terminated.any() or truncated.any():
            final_obs, final_infos = self._fill_finals(obs, terminated, truncated, final_obs, final_infos)
        self._last_obs = obs
        return obs, rewards, terminated, truncated, infos, final_obs, final_infos

    def _size(self, j: int) -> int:
        lo, hi = self._bounds[j]
        return hi - lo

    # ------------------------------------------------------------------------------- reply checks
    # Replies are checked against the declared spaces where they arrive: shapes and kinds only (a few
    # attribute compares per field, nothing per element), so a wrong shape is a ProtocolError naming
    # the field, both shapes and the copies, not a numpy error deep inside a learner.
    def _bad_reply(self, j: int, op: str, field: str, why: str, copy: int | None = None) -> ProtocolError:
        lo, hi = self._bounds[j]
        copies = f"copy {lo + copy}" if copy is not None else f"copy {lo}" if hi - lo == 1 else f"copies {lo}-{hi - 1}"
        return ProtocolError(f"{self.procs[j].name} ({self.procs[j].label}, {copies}): the {op} reply's {field} {why} "
                             "(see docs/connector-protocol.md)")

    def _check_obs(self, j: int, op: str, reply: dict) -> None:
        n = self._size(j)
        why = shape_mismatch(reply["obs"], self.single_observation_space, n)
        if why is not None:
            raise self._bad_reply(j, op, "'obs'", f"{why}: {n} observation(s) of {self.single_observation_space}")
        infos = reply.get("infos")
        if infos is not None and (not isinstance(infos, list) or len(infos) != n):
            got = f"has {len(infos)} entries" if isinstance(infos, list) else f"is a {type(infos).__name__}"
            raise self._bad_reply(j, op, "'infos'", f"{got}, expected a list of {n} maps (one per copy)")

    def _check_step(self, j: int, reply: dict) -> None:
        """Check a step reply's shapes and make its flags bool arrays (in place)."""
        self._check_obs(j, "step", reply)
        n = self._size(j)
        for key in ("rewards", "terminated", "truncated"):
            value = reply[key]
            why = array_mismatch(value, (n,))
            if why is not None:
                raise self._bad_reply(j, "step", repr(key), f"{why} (one per copy)")
            reply[key] = np.asarray(value, dtype=np.float64 if key == "rewards" else bool)  # no copy when it is one
        for key in ("final_obs", "final_infos"):
            value = reply.get(key)
            if value is not None and (not isinstance(value, list) or len(value) != n):
                got = f"has {len(value)} entries" if isinstance(value, list) else f"is a {type(value).__name__}"
                raise self._bad_reply(j, "step", repr(key), f"{got}, expected a list of {n} (one per copy, nil if not ended)")
        final_obs = reply.get("final_obs")
        if final_obs is not None:
            for i, fo in enumerate(final_obs):
                if fo is not None:
                    why = shape_mismatch(fo, self.single_observation_space)
                    if why is not None:
                        raise self._bad_reply(j, "step", f"'final_obs'[{i}]", f"{why}: one observation of "
                                              f"{self.single_observation_space}", copy=i)

    def _fill_finals(self, obs: Any, terminated: np.ndarray, truncated: np.ndarray, final_obs: list | None,
                     final_infos: list | None) -> tuple[list, list]:
        """``final_obs`` and ``final_infos`` are optional on the wire: a copy that ended without them gets
        its reported ``obs`` and ``{}``. A terminated episode never bootstraps, so that is exact; a
        truncated one then bootstraps from the next episode's first observation (warned once)."""
        final_obs = list(final_obs) if final_obs is not None else [None] * self.num_envs
        final_infos = list(final_infos) if final_infos is not None else [None] * self.num_envs
        for i in np.flatnonzero(np.logical_or(terminated, truncated)).tolist():
            if final_obs[i] is None:
                final_obs[i] = index(obs, i)
                if truncated[i] and not terminated[i] and not self._warned_no_final_obs:
                    self._warned_no_final_obs = True
                    log.warning("%s: copy %d was truncated without a final_obs; learners bootstrap from its reported obs "
                                "(the next episode's first); send final_obs for truncated copies "
                                "(docs/connector-protocol.md, step)", self.procs[0].name, i)
            if final_infos[i] is None:
                final_infos[i] = {}
        return final_obs, final_infos

    def _restart(self, j: int, reason: str) -> dict:
        """Restart process ``j`` and describe the step as: every episode it hosted was truncated."""
        p = self.procs[j]
        lo, hi = self._bounds[j]
        n = hi - lo
        p.recover(reason)
        seeds = None
        if p.describe.get("reset_accepts_seed"):  # fresh, distinct streams: not all copies replaying the config seed
            if self._run_seed is None:
                base = int(np.random.SeedSequence().generate_state(1)[0])
                seeds = [base + i for i in range(n)]
            else:  # reproducible: the run's seed, the copy and how often its process restarted
                seeds = [derive_seed(self._run_seed, self.worker_index, lo + i, p.restarts) for i in range(n)]
        while True:
            try:
                reply = p.call({"op": "reset", "seeds": seeds, "env_ids": None})
                break
            except ProcessFailed as e:
                p.recover(str(e))
        flag = {RESTART_KEY: True}
        last = _slice(self._last_obs, lo, hi) if self._last_obs is not None else reply["obs"]
        return {
            "obs": reply["obs"],
            "rewards": np.zeros(n, dtype=np.float64),
            "terminated": np.zeros(n, dtype=bool),
            "truncated": np.ones(n, dtype=bool),
            "infos": [{**info, **flag} for info in (reply.get("infos") or [{}] * n)],
            "final_obs": [index(last, i) for i in range(n)],
            "final_infos": [dict(flag) for _ in range(n)],
        }

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, rewards, terminated, truncated, per_env, final_obs, final_infos = self._step(actions)
        infos: dict = {}
        if final_obs is None and not per_env:
            return obs, rewards, terminated, truncated, infos
        per_env = per_env or [{}] * self.num_envs
        for i in range(self.num_envs):
            if final_obs is not None and final_infos is not None and final_obs[i] is not None:  # set together
                fo = conform(final_obs[i], self.single_observation_space)
                infos = self._add_info(infos, {"final_obs": fo, "final_info": final_infos[i] or {}}, i)
            if per_env[i]:
                infos = self._add_info(infos, per_env[i], i)
        return obs, rewards, terminated, truncated, infos

    def restart_connectors(self) -> None:
        """Restart every connector process, e.g. to load upgraded connector code without stopping training.

        The processes go down now; the next ``step`` starts fresh ones and reports the episodes they
        were running as truncated with ``info["polar/connector_restart"] = True``.
        """
        with self._lock:
            for p in self.procs:
                p.dead_reason = "a restart was requested"
                p.kill()

    # ------------------------------------------------------------------------------- liveness
    def _heartbeat(self, interval_s: float, timeout_s: float) -> None:
        if not self._lock.acquire(blocking=False):
            return  # a call is in flight: that call's timeout is the liveness check
        try:
            for p in self.procs:
                if p.dead_reason is None and time.monotonic() - p.last_io >= interval_s:
                    p.heartbeat(timeout_s)
        finally:
            self._lock.release()

    def _close_procs(self) -> None:
        self._stop.set()
        for p in self.procs:
            p.close()

    def close_extras(self, **kwargs: Any) -> None:
        with self._lock:
            self._close_procs()

    def __del__(self) -> None:
        if not getattr(self, "closed", True) and getattr(self, "procs", None):
            self.close()


def _heartbeat_loop(ref: weakref.ref, stop: threading.Event, interval_s: float, timeout_s: float) -> None:
    while not stop.wait(interval_s):
        envs = ref()
        if envs is None:
            return
        envs._heartbeat(interval_s, timeout_s)
        del envs


class ConnectorEnv(gym.Env):
    """One copy of a connector as a plain ``gymnasium.Env`` (for evaluation, ``polar check``, scripts)."""

    metadata: dict = {}

    def __init__(self, spec: ConnectorSpec, config_dir: Path | None = None) -> None:
        spec = spec.model_copy(update={"copies_per_process": 1})
        self.vec = ConnectorVectorEnv(spec, 1, config_dir=config_dir)
        self.observation_space = self.vec.single_observation_space
        self.action_space = self.vec.single_action_space
        self._next: tuple[Any, dict] | None = None  # the connector already auto-reset: its first obs

    @property
    def restarts(self) -> int:
        return self.vec.restarts

    @property
    def reset_accepts_seed(self) -> bool:
        """False for a connector whose ``reset()`` takes no seed: ``reset(seed=s)`` cannot replay an episode."""
        return bool(self.vec.procs[0].describe.get("reset_accepts_seed", True))

    @property
    def connector_name(self) -> str:
        return self.vec.name

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is None and not options and self._next is not None:
            obs, info = self._next
        else:
            batched, infos = self.vec.reset_raw(None if seed is None else [seed])
            obs, info = index(batched, 0), infos[0]
        self._next = None
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if isinstance(self.action_space, spaces.Dict):
            batched = {k: np.asarray(v)[None] for k, v in action.items()}
        else:
            batched = np.asarray(action)[None]
        obs, rewards, term, trunc, infos, final_obs, final_infos = self.vec.step_raw(batched)
        if term[0] or trunc[0]:
            assert final_obs is not None and final_infos is not None  # step_raw fills both when a copy ends
            self._next = (index(obs, 0), infos[0])
            obs_0 = conform(final_obs[0], self.observation_space)
            return obs_0, float(rewards[0]), bool(term[0]), bool(trunc[0]), final_infos[0] or {}
        return index(obs, 0), float(rewards[0]), False, False, infos[0]

    def close(self) -> None:
        self.vec.close()
