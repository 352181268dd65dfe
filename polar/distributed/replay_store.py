"""A distributed trajectory/replay store: sharded Ray actors with bounded memory and backpressure.

Two modes, one shard actor:

- ``fifo``: a bounded queue. Each item is consumed once (rollout fragments for an async learner,
  finished agentic sessions for GRPO). A full shard makes ``put`` wait; after ``timeout_s`` the
  producer is told to back off (``PutResult.accepted == False``) instead of growing memory.
- ``replay``: a ring buffer sampled uniformly with replacement (off-policy learners). It evicts the
  oldest item when full; producers are throttled by ``max_inserts_per_sample`` so they cannot race
  arbitrarily far ahead of the learner.

Items are whatever the producer sends (dicts of numpy arrays, trajectory dicts); Ray keeps numpy
arrays zero-copy in its object store. The data never leaves the cluster's own processes.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass
from typing import Any, Literal

from polar.errors import DistributedError


@dataclass
class PutResult:
    accepted: bool
    depth: int  # items in the shard after the call
    shard: int = -1


class _Shard:
    """One shard; runs as an async Ray actor so blocked producers do not block consumers."""

    def __init__(self, index: int, capacity: int, mode: str, max_inserts_per_sample: float, seed: int) -> None:
        self.index = index
        self.capacity = capacity
        self.mode = mode
        self.max_inserts_per_sample = max_inserts_per_sample
        self.items: list[Any] = []
        self.head = 0  # ring position for replay mode
        self.rng = random.Random(seed + index)
        self.cond = asyncio.Condition()
        self.stats = {"puts": 0, "rejected": 0, "gets": 0, "sampled": 0, "evicted": 0, "waits": 0}

    def ready(self) -> int:
        return self.index

    def _full(self) -> bool:
        if self.mode == "fifo":
            return len(self.items) >= self.capacity
        if self.max_inserts_per_sample <= 0:
            return False
        # replay: do not let inserts run too far ahead of what the learner samples
        allowed = self.capacity + self.max_inserts_per_sample * self.stats["sampled"]
        return self.stats["puts"] >= allowed

    async def try_put(self, item: Any) -> PutResult:
        """Insert only if there is room now; a refusal here is not counted (the client tries other shards)."""
        async with self.cond:
            if self._full():
                return PutResult(False, len(self.items), self.index)
            self._insert(item)
            self.stats["puts"] += 1
            self.cond.notify_all()
            return PutResult(True, len(self.items), self.index)

    async def put(self, item: Any, timeout_s: float = 0.0) -> PutResult:
        async with self.cond:
            if self._full():
                self.stats["waits"] += 1
                try:
                    await asyncio.wait_for(self.cond.wait_for(lambda: not self._full()), timeout=max(timeout_s, 0.0) or 1e-6)
                except asyncio.TimeoutError:
                    self.stats["rejected"] += 1
                    return PutResult(False, len(self.items), self.index)
            self._insert(item)
            self.stats["puts"] += 1
            self.cond.notify_all()
            return PutResult(True, len(self.items), self.index)

    def _insert(self, item: Any) -> None:
        if self.mode == "fifo" or len(self.items) < self.capacity:
            self.items.append(item)
            return
        self.items[self.head] = item
        self.head = (self.head + 1) % self.capacity
        self.stats["evicted"] += 1

    async def get(self, max_items: int, timeout_s: float = 0.0) -> list[Any]:
        """FIFO: take up to ``max_items``, waiting up to ``timeout_s`` for the first one."""
        async with self.cond:
            if not self.items and timeout_s > 0:
                try:
                    await asyncio.wait_for(self.cond.wait_for(lambda: bool(self.items)), timeout=timeout_s)
                except asyncio.TimeoutError:
                    return []
            out, self.items = self.items[:max_items], self.items[max_items:]
            self.stats["gets"] += len(out)
            if out:
                self.cond.notify_all()
            return out

    async def sample(self, n: int) -> list[Any]:
        async with self.cond:
            if not self.items:
                return []
            out = [self.items[self.rng.randrange(len(self.items))] for _ in range(n)]
            self.stats["sampled"] += n
            self.cond.notify_all()
            return out

    def depth(self) -> int:
        return len(self.items)

    def get_stats(self) -> dict[str, int]:
        return {**self.stats, "depth": len(self.items), "capacity": self.capacity}


_REMOTE_SHARD = None


def _remote_shard_cls():
    global _REMOTE_SHARD
    if _REMOTE_SHARD is None:
        import ray

        _REMOTE_SHARD = ray.remote(num_cpus=0, max_restarts=0)(_Shard)
    return _REMOTE_SHARD


class ShardedStore:
    """Client over ``num_shards`` shard actors; usable from the driver or from any actor it is passed to.

    ``put`` spreads items round-robin and moves on to the next shard when one is full, so a producer
    is only told to back off when every shard is full for ``timeout_s``.
    """

    def __init__(
        self,
        num_shards: int = 2,
        capacity_per_shard: int = 1024,
        mode: Literal["fifo", "replay"] = "fifo",
        max_inserts_per_sample: float = 0.0,
        seed: int = 0,
        shards: list[Any] | None = None,
        shard_options: dict[str, Any] | None = None,
    ) -> None:
        if mode not in ("fifo", "replay"):
            raise DistributedError(f"replay store mode must be 'fifo' or 'replay', got {mode!r}")
        if num_shards < 1 or capacity_per_shard < 1:
            raise DistributedError(
                f"replay store needs num_shards >= 1 and capacity_per_shard >= 1 (got {num_shards}, {capacity_per_shard})"
            )
        self.mode = mode
        if shards is None:
            cls = _remote_shard_cls().options(**(shard_options or {}))
            shards = [cls.remote(i, capacity_per_shard, mode, max_inserts_per_sample, seed) for i in range(num_shards)]
        self.shards = shards
        self._rr = itertools.count()

    def __reduce__(self):
        # travels to other actors as its shard handles (no new actors are made there)
        return (_rebuild_store, (self.shards, self.mode))

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        from polar.distributed.cluster import wait_ready

        wait_ready([s.ready.remote() for s in self.shards], timeout_s, "replay-store shards")

    def put(self, item: Any, timeout_s: float = 5.0, key: int | None = None) -> PutResult:
        """Store one item. Blocks up to ``timeout_s`` in total when shards are full; ``accepted=False`` means back off."""
        import ray

        n = len(self.shards)
        start = key % n if key is not None else next(self._rr) % n
        ref = ray.put(item)  # serialized once, whichever shard takes it (a top-level ref arrives as its value)
        order = [(start + i) % n for i in range(n)]
        for i in order:  # first pass: any shard with room, no waiting
            res = ray.get(self.shards[i].try_put.remote(ref))
            if res.accepted:
                return res
        return ray.get(self.shards[start].put.remote(ref, timeout_s))

    def get(self, max_items: int, timeout_s: float = 1.0) -> list[Any]:
        """FIFO: up to ``max_items`` items from all shards; waits up to ``timeout_s`` when all are empty."""
        import ray

        per = max(1, max_items // len(self.shards))
        out: list[Any] = []
        for batch in ray.get([s.get.remote(per, 0.0) for s in self.shards]):
            out.extend(batch)
        if not out and timeout_s > 0:
            refs = [s.get.remote(per, timeout_s) for s in self.shards]
            for batch in ray.get(refs):
                out.extend(batch)
        return out

    def sample(self, n: int) -> list[Any]:
        """Replay: ``n`` items uniformly over everything stored (shards weighted by their size)."""
        import ray

        depths = ray.get([s.depth.remote() for s in self.shards])
        total = sum(depths)
        if total == 0:
            return []
        counts = [0] * len(self.shards)
        for _ in range(n):
            r = random.randrange(total)
            for i, d in enumerate(depths):
                if r < d:
                    counts[i] += 1
                    break
                r -= d
        refs = [s.sample.remote(c) for s, c in zip(self.shards, counts, strict=True) if c]
        return [x for batch in ray.get(refs) for x in batch]

    def stats(self) -> list[dict[str, int]]:
        import ray

        return ray.get([s.get_stats.remote() for s in self.shards])

    def depth(self) -> int:
        return sum(s["depth"] for s in self.stats())

    def close(self) -> None:
        import ray

        for s in self.shards:
            ray.kill(s)


def _rebuild_store(shards: list[Any], mode: str) -> ShardedStore:
    return ShardedStore(mode=mode, shards=shards)  # type: ignore[arg-type]
