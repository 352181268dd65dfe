"""What does running an env in a connector process cost? CartPole-v1 steps/s, side by side.

Rows: in-process ``SyncVectorEnv`` (the reference), polar connectors with 16 copies in one process
(with shared-memory steps, the default, and with ``shared_memory: false``, every message on the socket)
and with 1 copy per process (16 processes), Gymnasium's own out-of-process ``AsyncVectorEnv`` for
context, and a single env in process vs through a connector for the per-step round-trip cost.
Rounds are interleaved and the median is reported, so background load hits every row alike.

    OMP_NUM_THREADS=1 python benchmarks/connector_overhead.py [--steps 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from polar.config.harness import ConnectorSpec
from polar.harness.connector.vector_env import ConnectorVectorEnv

ENV_ID = "CartPole-v1"


def sync_env(n: int):
    return gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID)] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def async_env(n: int):
    return gym.vector.AsyncVectorEnv([lambda: gym.make(ENV_ID)] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def connector_env(n: int, copies: int, shared_memory: bool = True):
    spec = ConnectorSpec(
        module="polar.harness.connector.gym_connector", class_name="GymnasiumConnector", config={"id": ENV_ID},
        copies_per_process=copies, heartbeat_interval_s=0, shared_memory=shared_memory,
    )
    return ConnectorVectorEnv(spec, n)


def steps_per_s(envs, n: int, steps: int, rng: np.random.Generator) -> float:
    actions = rng.integers(0, 2, size=(steps, n))
    envs.step(actions[0])  # warm
    t0 = time.perf_counter()
    for a in actions:
        envs.step(a)
    return steps * n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="vector steps per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = {
        "in-process SyncVectorEnv, 16 envs": lambda: sync_env(16),
        "polar connector, 16 copies x 1 process": lambda: connector_env(16, 16),
        "polar connector, 16 copies x 1 process, socket": lambda: connector_env(16, 16, shared_memory=False),
        "polar connector, 1 copy x 16 processes": lambda: connector_env(16, 1),
        "gymnasium AsyncVectorEnv, 16 processes": lambda: async_env(16),
        "in-process SyncVectorEnv, 1 env": lambda: sync_env(1),
        "polar connector, 1 copy x 1 process": lambda: connector_env(1, 1),
    }
    envs = {name: make() for name, make in rows.items()}
    for e in envs.values():
        e.reset(seed=0)
    rng = np.random.default_rng(0)
    results: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, e in envs.items():
            results[name].append(steps_per_s(e, e.num_envs, args.steps, rng))
    conn = envs["polar connector, 1 copy x 1 process"]
    t0 = time.perf_counter()
    for _ in range(2000):
        conn.procs[0].call({"op": "ping"})
    ping_us = (time.perf_counter() - t0) / 2000 * 1e6
    shared = envs["polar connector, 16 copies x 1 process"].procs[0].shared_memory
    for e in envs.values():
        e.close()

    med = {name: statistics.median(v) for name, v in results.items()}
    ref16, ref1 = med["in-process SyncVectorEnv, 16 envs"], med["in-process SyncVectorEnv, 1 env"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"CartPole-v1 | {platform.processor() or platform.machine()} | {os.cpu_count()} CPUs | "
          f"Python {platform.python_version()} | load average {load:.1f}")
    print(f"{'setup':<48} {'steps/s':>10} {'vs in-process':>14}")
    for name, v in med.items():
        ref = ref1 if name.endswith("1 env") or name.endswith("1 copy x 1 process") else ref16
        print(f"{name:<48} {v:>10,.0f} {v / ref:>13.0%}")
    per_step_in = 1e6 / ref1
    per_step_conn = 1e6 / med["polar connector, 1 copy x 1 process"]
    batch_in = 16e6 / ref16
    batch_conn = 16e6 / med["polar connector, 16 copies x 1 process"]
    print(f"\nround-trip overhead per step, 1 copy:    {per_step_conn - per_step_in:8.1f} us  (step {per_step_conn:.1f} vs {per_step_in:.1f} us)")
    print(f"round-trip overhead per step, 16 copies: {batch_conn - batch_in:8.1f} us per batch = "
          f"{(batch_conn - batch_in) / 16:.1f} us per env step")
    print(f"bare ping round trip (Unix socket):      {ping_us:8.1f} us")
    print(f"shared-memory steps: {'on' if shared else 'off (not offered here)'}")
    target = med["polar connector, 16 copies x 1 process"] / ref16
    print(f"\ntarget: 16 copies per process >= 70% of in-process vectorized (issue 38) -> {target:.1%} "
          f"({'met' if target >= 0.7 else 'NOT met'})")


if __name__ == "__main__":
    main()
