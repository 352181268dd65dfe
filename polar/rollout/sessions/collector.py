"""Collectors of agent runs, beside the sessions they collect: ``SessionCollector`` (GRPO's groups of agent
sessions from the rollout service: harness -> gateway -> verifier) and ``DemonstrationCollector`` (SFT's
minibatches of demonstrations).

With ``max_off_policy_steps >= 1`` the next batch of sessions is collected while this one trains (its sessions
may straddle a weight swap; each sample's oldest policy version decides whether it is still fresh enough).
With partial rollouts (``polar.rollout.sessions.partial``) groups run on across weight updates instead, and each
step takes the first that finish.
With dynamic sampling the collector draws more rounds until ``tasks_per_step`` groups have rewards that differ
(bounded); the difficulty filter and a reasoning-gym curriculum (``polar.rollout.sessions.task_sampling``)
choose which tasks it draws, and their state is the collector's share of a checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from polar.rollout.sessions.partial import GroupStream, PartialRollouts, oldest_version, spans_update, stale
from polar.rollout.sessions.stats import live_counts, session_metrics
from polar.rollout.sessions.task_sampling import Curriculum, TaskDifficulty
from polar.types import Batch, Metrics, SessionResult, TrajectorySample

log = logging.getLogger(__name__)

Groups = list[list[SessionResult]]
GroupRequest = tuple[dict[str, Any], int, dict[str, Any]]
"""``(task, sessions, metadata)``: one group to run."""


class SessionStack(Protocol):
    """A started rollout stack (``LocalStack``, ``RaySessionStack``): runs groups of sessions, swaps weights."""

    @property
    def engine(self) -> Any: ...

    def run_groups(self, groups: list[GroupRequest], timeout_s: float | None = None) -> Groups: ...

    def update_weights(self, state_dict: Any, version: int) -> dict[str, Any]: ...


class SessionCollector:
    """The Collector of agent runs: one batch is ``tasks_per_step`` groups of ``group_size`` sessions of tasks
    drawn without replacement (reshuffled when all were drawn) from a started rollout stack (``SessionStack``).

    ``batches`` is how many batches the run still needs: with ``prefetch`` the next one is submitted as soon as
    this one arrived, but never one past the end. While a batch is collected it logs its sessions' progress
    every ``HEARTBEAT_S``; each batch adds the session rates of ``polar.rollout.sessions.stats`` and the
    sampled tokens per second of its collection to the step's metrics (``polar.rollout.sessions.stats``).

    ``start`` hands the engine the weights the run starts with when its version differs from the engine's (after
    an SFT warm-up, or on resume: the engine starts fresh); ``state_dict`` holds the difficulty filter's
    estimates and the curriculum's levels; ``load_state_dict`` restores them and the step the run resumes at.

    With ``partial`` (partial rollouts) groups are submitted one by one and run on across weight updates
    (``polar.rollout.sessions.partial``): a batch is the first ``tasks_per_step`` groups that finish, oldest
    first, leaving out those with a token more than ``partial.max_staleness`` versions behind."""

    HEARTBEAT_S = 30.0

    def __init__(self, stack: SessionStack, tasks: list[dict[str, Any]], tasks_per_step: int, group_size: int,
                 seed: int, batches: int, prefetch: bool, first_step: int = 0, max_extra_rounds: int = 0,
                 signal: Callable[[list[SessionResult]], bool] | None = None,
                 difficulty: TaskDifficulty | None = None, curriculum: Curriculum | None = None,
                 partial: PartialRollouts | None = None) -> None:
        self.stack = stack
        self.total_batches = batches
        self.curriculum = curriculum
        self.max_extra_rounds = max_extra_rounds if signal is not None else 0
        self.signal = signal
        self.difficulty = difficulty
        self.tasks = list(tasks)
        self.tasks_per_step = tasks_per_step
        self.group_size = group_size
        self.rng = random.Random(seed)
        self.left = batches
        self.prefetch = prefetch and partial is None  # partial rollouts stream groups instead
        self.step = first_step
        self.wait_s = 0.0
        self.batch_counts: Metrics = {}
        self._order: list[int] = []
        # the batch under way: its future, the step it is for, when it was submitted
        self._pending: tuple[concurrent.futures.Future[Groups], int, float] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="polar-collect")
        self.partial = partial
        self._stream = (GroupStream(lambda request: self.stack.run_groups([request])[0], partial.max_groups_in_flight)
                        if partial is not None else None)
        self._version = 0  # the engine's policy version (start, publish)
        self._first_submitted = 0.0  # when the oldest group of the batch being collected was submitted

    def _next_tasks(self, n: int) -> list[dict[str, Any]]:
        """``n`` tasks, in a shuffled pass over all of them; with ``difficulty`` a task whose turn comes is drawn
        only if it admits it (a pass that admitted none in a whole round of the tasks takes the next anyway)."""
        out: list[dict[str, Any]] = []
        passed_over = 0
        while len(out) < n:
            if not self._order:
                self._order = list(range(len(self.tasks)))
                self.rng.shuffle(self._order)
            task = self.tasks[self._order.pop()]
            if (self.difficulty is None or passed_over >= len(self.tasks)
                    or self.difficulty.admit(str(task.get("id", "")), self.rng)):
                out.append(task)
                passed_over = 0
            else:
                passed_over += 1
        return out

    def _submit(self, n: int | None = None, step: int | None = None) -> tuple[concurrent.futures.Future[Groups], int, float]:
        step = self.step if step is None else step
        groups = [(t, self.group_size, {"rollout_step": step, "dataset_task_id": str(t.get("id", ""))})
                  for t in self._next_tasks(n or self.tasks_per_step)]
        return self._pool.submit(self.stack.run_groups, groups), step, time.monotonic()

    def _fill_with_signal(self, groups: Groups, step: int, trained_step: int) -> tuple[Groups, Groups, int]:
        """DAPO's dynamic sampling: while fewer than ``tasks_per_step`` groups have a signal, draw another round
        (as many groups as the share of signal so far says are needed, at most ``tasks_per_step``), at most
        ``max_extra_rounds`` rounds; only the extra groups with a signal join the batch. Returns the batch's
        groups, the extra groups left out (sampled all the same: they count as sessions and tokens, and in
        the pass rates) and the number of extra rounds."""
        with_signal = sum(map(self.signal, groups)) if self.signal is not None else 0
        drawn, rounds = len(groups), 0
        left_out: Groups = []
        while self.signal is not None and with_signal < self.tasks_per_step and rounds < self.max_extra_rounds:
            missing = self.tasks_per_step - with_signal
            share = with_signal / max(1, drawn)
            n = self.tasks_per_step if share == 0 else min(self.tasks_per_step, math.ceil(missing / share))
            future, _, submitted = self._submit(n, step)
            more = self._wait(future, step, submitted)
            rounds += 1
            drawn += len(more)
            if self.difficulty is not None:
                self.difficulty.observe(more)
            useful = [g for g in more if self.signal(g)][:missing]
            left_out.extend(g for g in more if not any(g is u for u in useful))
            groups = [*groups, *useful]
            with_signal += len(useful)
        if rounds:
            log.info("step %d: dynamic sampling drew %d groups in %d extra round(s); %d of %d groups have a signal",
                     trained_step + 1, drawn, rounds, with_signal, self.tasks_per_step)
        if self.max_extra_rounds and with_signal == 0:
            log.warning("step %d: no group of the %d drawn (%d extra rounds, policy.kwargs.dynamic_sampling."
                        "max_extra_rounds) has rewards that differ, so the step is skipped. What helps: a larger "
                        "group (policy.kwargs.group_size), partial-credit rewards from the verifier, easier tasks "
                        "(policy.kwargs.difficulty_filter, a curriculum), more extra rounds, or an SFT warm-up",
                        trained_step + 1, drawn, rounds)
        return groups, left_out, rounds

    def _wait(self, future: concurrent.futures.Future[Groups], step: int, submitted: float) -> Groups:
        """The batch's groups; while they are collected, a line in session words every ``HEARTBEAT_S``."""
        while True:
            try:
                return future.result(timeout=self.HEARTBEAT_S)
            except concurrent.futures.TimeoutError:
                c = live_counts(self.stack, lambda m: m.get("rollout_step") == step)
                if c is None:
                    log.info("step %d: collecting sessions, %.0fs", step + 1, time.monotonic() - submitted)
                    continue
                by = ", ".join(f"{k} {v}" for k, v in sorted(c.statuses.items()))
                reward = "" if c.reward_mean is None else f", reward {c.reward_mean:.3g} so far"
                log.info("step %d: collecting, %d/%d sessions finished (%s)%s, %.0fs", step + 1, c.finished,
                         c.sessions, by or "none yet", reward, time.monotonic() - submitted)

    def start(self, weights: Mapping[str, Any], version: int) -> None:
        if int(self.stack.engine.policy_version) != version:
            self.stack.update_weights(weights, version)
        self._version = version
        if self._stream is not None:
            self._top_up(0)
        elif self.prefetch and self.left > 0:
            self._pending = self._submit()

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"step": self.step}  # batches collected: the GRPO steps (tools read agent runs so)
        if self.difficulty is not None:
            state["task_difficulty"] = self.difficulty.state_dict()
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The checkpoint's task-sampling state and step (before ``start``); a run that drew tasks uniformly
        has no ``task_difficulty``, one without an advancing curriculum no ``curriculum``."""
        if self.difficulty is not None and "task_difficulty" in state:
            self.difficulty.load_state_dict(state["task_difficulty"])
        if self.curriculum is not None and "curriculum" in state:
            self.curriculum.load_state_dict(state["curriculum"])
            if self.curriculum.advances:  # resumed past an advance: draw at its levels
                self.tasks, self._order = self.curriculum.tasks(), []
        self.step = int(state.get("iteration", state.get("step", 0)))
        self.left = max(0, self.total_batches - self.step)

    # ------------------------------------------------------------------ partial rollouts
    def _top_up(self, taken: int, at_least: int = 0) -> None:
        """Submit groups (under the current version) until ``min(max_groups_in_flight, what the run's steps still
        take) - taken`` are untrained (``at_least`` when a step waits for one more); ``taken``: the groups the step
        being collected has kept so far."""
        assert self._stream is not None
        target = max(at_least, min(self._stream.capacity, self.left * self.tasks_per_step) - taken)
        while self._stream.untrained < target:
            [task] = self._next_tasks(1)
            self._stream.submit((task, self.group_size, {"rollout_step": self.step,
                                                         "dataset_task_id": str(task.get("id", ""))}), self._version)

    def _take(self, t0: float) -> list[SessionResult]:
        """The oldest group to finish; a line in session words every ``HEARTBEAT_S`` while none has."""
        assert self._stream is not None
        while True:
            group = self._stream.take(self.HEARTBEAT_S)
            if group is not None:
                return group
            log.info("step %d: partial rollouts, %d groups under way, %.0fs", self.step + 1, self._stream.running,
                     time.monotonic() - t0)

    def _collect_partial(self, t0: float) -> tuple[Groups, Groups, int, dict[str, float]]:
        """The first ``tasks_per_step`` groups to finish whose tokens are at most ``max_staleness`` versions old
        (older ones are dropped); with dynamic sampling, while fewer than ``tasks_per_step`` of them have a
        signal, up to ``max_extra_rounds x tasks_per_step`` more, of which only those with a signal join (the
        rest are ``left_out``, as in a batch at a time)."""
        assert self.partial is not None and self._stream is not None
        stream = self._stream
        n, k = self.tasks_per_step, self.partial.max_staleness
        groups: Groups = []
        left_out: Groups = []
        dropped = extra = 0
        self._first_submitted = math.inf
        while True:
            with_signal = sum(map(self.signal, groups)) if self.signal is not None else n
            if len(groups) >= n and (with_signal >= n or extra >= self.max_extra_rounds * n):
                break
            self._top_up(min(len(groups), n), at_least=1)
            group = self._take(t0)
            self._first_submitted = min(self._first_submitted, stream.last_submitted_at)
            if self.difficulty is not None:
                self.difficulty.observe([group])
            if stale(group, self._version, k):
                dropped += 1
                log.info("step %d: a group of task %s has a token %d versions old (max_off_policy_steps %d); "
                         "dropped", self.step + 1, group[0].task_id if group else "?",
                         self._version - (oldest_version(group) or 0), k)
            elif len(groups) < n:
                groups.append(group)
            else:
                extra += 1
                if self.signal is not None and self.signal(group):
                    groups.append(group)
                else:
                    left_out.append(group)
        if self.max_extra_rounds and self.signal is not None and not any(map(self.signal, groups)):
            log.warning("step %d: no group of the %d taken (%d extra, policy.kwargs.dynamic_sampling.max_extra_rounds) "
                        "has rewards that differ, so the step is skipped; a larger group_size, partial-credit rewards "
                        "or easier tasks help", self.step + 1, len(groups) + len(left_out), extra)
        results = [r for g in (*groups, *left_out) for r in g]
        counts = {"partial/groups_stale": float(dropped), "partial/groups_untrained": float(stream.untrained),
                  "partial/sessions_spanning_update": float(sum(map(spans_update, results)))}
        return groups, left_out, math.ceil(extra / n), counts

    def collect(self) -> Batch[Groups]:
        t0 = time.monotonic()
        partial_counts: Metrics = {}
        if self._stream is not None:
            groups, left_out, rounds, partial_counts = self._collect_partial(t0)
            submitted = self._first_submitted  # the sampled tokens per second: since its oldest group started
        else:
            future, step, submitted = self._pending if self._pending is not None else self._submit()
            self._pending = None
            groups = self._wait(future, step, submitted)
            if self.difficulty is not None:
                self.difficulty.observe(groups)
            # (a prefetched batch carries the step it was submitted at as its rollout_step; the logs say the step
            # it trains, self.step)
            groups, left_out, rounds = self._fill_with_signal(groups, step, self.step)
        if self.curriculum is not None:
            advanced = self.curriculum.observe([*groups, *left_out])  # every group drawn: the pass rate unbiased
            if advanced is not None:  # the next draw is at the new levels (a batch already under way is not)
                self.tasks, self._order = advanced, []
                log.info("step %d: the pass rate reached %g; curriculum levels now %s", self.step + 1,
                         self.curriculum.advance.threshold, self.curriculum.levels)
        collect_s = time.monotonic() - submitted
        self.wait_s = time.monotonic() - t0
        self.left -= 1
        if self.prefetch and self.left > 0:
            self._pending = self._submit()  # collect the next batch while this one trains
        self.step += 1
        # every session sampled for this step (left-out groups included: they cost the same), so the counts,
        # rates and the reward mean describe the policy, not the selection
        results = [r for g in (*groups, *left_out) for r in g]
        # this batch: sessions re-dispatched after their gateway node was lost, and sessions that did not finish
        tokens = sum(sum(s.loss_mask) for r in results for s in r.samples)
        self.batch_counts = {"sessions/step_redispatched": sum(r.redispatched for r in results),
                             "sessions/step_failed": sum(r.status.value != "done" for r in results),
                             "sessions/step_sampled_tokens": tokens,
                             "sessions/sampled_tokens_per_s": round(tokens / max(1e-9, collect_s), 2),
                             "groups_drawn": len(groups) + len(left_out), "dynamic_sampling/extra_rounds": rounds,
                             **(self.difficulty.metrics() if self.difficulty is not None else {}),
                             **(self.curriculum.metrics() if self.curriculum is not None else {}),
                             **partial_counts, **session_metrics(results)}
        # the oldest weights each trained session sampled with: the loop's policy_lag
        versions = [v for g in groups for r in g if (v := oldest_version([r])) is not None]
        return Batch(data=groups, env_steps=len(results),
                     episode_returns=[float(r.reward) for r in results if r.reward is not None],
                     episode_lengths=[len(r.samples) for r in results if r.reward is not None],
                     policy_versions=versions)

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        self.stack.update_weights(weights, version)
        self._version = version
        if self._stream is not None:
            self._top_up(0)  # the new version's share of groups (AReaL's bound)

    def metrics(self) -> Metrics:
        stack_metrics = getattr(self.stack, "metrics", None)  # the Ray stack: its nodes, restarts, re-dispatches
        return {"collect_wait_s": round(self.wait_s, 3), **self.batch_counts,
                **(stack_metrics() if callable(stack_metrics) else {})}

    def close(self) -> None:
        if self._pending is not None:
            self._pending[0].cancel()  # a batch not yet started; one under way finishes (SIGTERM's grace bounds it)
        self._pool.shutdown(wait=True)
        if self._stream is not None:
            self._stream.close()



class DemonstrationCollector:
    """SFT's collector: ``demonstration_batches`` minibatches of a list of demonstrations, one per ``collect``
    (``env_steps`` 0: no episode is played). It publishes nothing: a warm-up stage ends with one new version,
    which the session collector hands the engine when it starts."""

    def __init__(self, batches: Iterator[list[TrajectorySample]]) -> None:
        self.batches = batches

    def start(self, weights: Mapping[str, Any], version: int) -> None:
        pass

    def collect(self) -> Batch[list[TrajectorySample]]:
        return Batch(data=next(self.batches), env_steps=0)

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        pass

    def metrics(self) -> Metrics:
        return {}

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass
