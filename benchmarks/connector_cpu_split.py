"""Where a connector step's time goes, in CPU time per batch of 16 CartPole-v1 steps (issue 38, item 4).

Wall time on a shared box measures the load; thread CPU time much less so. Rows:
in-process ``SyncVectorEnv.step`` (the reference); the connector side (``Host.step`` plus writing the reply
into the shared mapping, or msgpack decode + ``Host.step`` + encode on the socket path); the polar side
(``ConnectorVectorEnv.step`` minus the time spent waiting for the reply, wake-up syscalls included); and the
polar side's Python alone (the reply counter answered at once, as when the spin catches the reply).
Connector side + polar side is the batch time with no scheduler wake-up, what an idle box approaches.

    OMP_NUM_THREADS=1 python benchmarks/connector_cpu_split.py [--steps 2000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from polar.config.harness import ConnectorSpec
from polar.harness.connector import server, shm
from polar.harness.connector.gym_connector import GymnasiumConnector
from polar.harness.connector.shm import SharedSteps
from polar.harness.connector.vector_env import ConnectorVectorEnv
from polar.harness.connector.wire import Codec

N, ROUNDS = 16, 3


def cpu_us(step: Callable[[np.ndarray], object], actions: np.ndarray, waited: list[float] | None = None) -> float:
    """Best of ROUNDS: thread CPU per call, less what ``waited`` collected."""
    best = float("inf")
    for _ in range(ROUNDS):
        if waited is not None:
            waited[0] = 0.0
        t = time.thread_time()
        for a in actions:
            step(a)
        spent = time.thread_time() - t - (waited[0] if waited is not None else 0.0)
        best = min(best, spent / len(actions) * 1e6)
    return best


def connector_env(shared_memory: bool) -> ConnectorVectorEnv:
    spec = ConnectorSpec(module="polar.harness.connector.gym_connector", class_name="GymnasiumConnector",
                         config={"id": "CartPole-v1"}, copies_per_process=N, heartbeat_interval_s=0,
                         shared_memory=shared_memory)
    envs = ConnectorVectorEnv(spec, N)
    envs.reset(seed=0)
    return envs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    actions = np.random.default_rng(0).integers(0, 2, size=(args.steps, N))
    rows: dict[str, float] = {}
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * N, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    sync.reset(seed=0)
    rows["in-process SyncVectorEnv.step"] = cpu_us(sync.step, actions)

    host = server.Host(GymnasiumConnector, {"id": "CartPole-v1"}, N)
    host.reset(list(range(N)), None)
    mapped, path = SharedSteps.create(N, ((N,), np.dtype("<i8")), ((N, 4), np.dtype("<f4")))
    SharedSteps.remove(path)

    def connector_shared(a: np.ndarray) -> None:
        mapped.arrays["actions"][...] = a
        server._put_reply(mapped, host.step(mapped.arrays["actions"].copy()))

    codec = Codec()

    def connector_socket(a: np.ndarray) -> None:
        reply = host.step(codec.unpack(codec.pack({"op": "step", "actions": a}))["actions"])
        reply["ok"] = True
        codec.pack(reply)

    rows["connector side, shared memory: Host.step + write reply"] = cpu_us(connector_shared, actions)
    rows["connector side, socket: decode + Host.step + encode"] = cpu_us(connector_socket, actions)

    for shared_memory in (True, False):
        envs = connector_env(shared_memory)
        proc = envs.procs[0]
        waited = [0.0]
        target: object = proc._shared if shared_memory else proc._conn
        name = "wait" if shared_memory else "recv"
        inner = getattr(target, name)

        def timed(*a: object, inner: Callable[..., object] = inner, waited: list[float] = waited, **kw: object) -> object:
            t = time.thread_time()
            out = inner(*a, **kw)
            waited[0] += time.thread_time() - t
            return out

        setattr(target, name, timed)
        label = "shared memory" if shared_memory else "socket"
        rows[f"polar side, {label}: step minus waiting"] = cpu_us(envs.step, actions, waited)
        envs.close()

    envs = connector_env(True)
    mapping = envs.procs[0]._shared
    assert mapping is not None

    def answered(seq_slot: int, old: int, *rest: object, **kw: object) -> int:
        mapping.slots[shm.REP_KIND] = shm.KIND_SHARED
        mapping.slots[shm.REP_SEQ] = old + 1
        return old + 1

    mapping.wait = answered  # type: ignore[method-assign]
    rows["polar side, shared memory: Python alone (reply caught by the spin)"] = cpu_us(envs.step, actions)
    mapping.wait = SharedSteps.wait.__get__(mapping)  # type: ignore[method-assign]
    envs.procs[0].kill()
    envs.close()

    for name, us in rows.items():
        print(f"{name:<70} {us:7.1f} us CPU per batch")
    ref = rows["in-process SyncVectorEnv.step"]
    for label, conn, polar in (
        ("shared memory, reply caught by the spin", "connector side, shared memory: Host.step + write reply",
         "polar side, shared memory: Python alone (reply caught by the spin)"),
        ("shared memory, as measured here", "connector side, shared memory: Host.step + write reply",
         "polar side, shared memory: step minus waiting"),
        ("socket, wake-ups not counted", "connector side, socket: decode + Host.step + encode",
         "polar side, socket: step minus waiting"),
    ):
        total = rows[conn] + rows[polar]
        print(f"{label:<45} {total:7.1f} us per batch -> {ref / total:.2f}x in-process")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
