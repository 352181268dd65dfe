"""Agent runs (``harness.type: agent``) through the one loop (``polar.trainers.loop``): GRPO on groups of agent
sessions, SFT on demonstrations.

- The Collector is ``SessionCollector``: ``tasks_per_step`` groups of ``group_size`` sessions from the rollout
  service (harness -> gateway -> verifier); with ``max_off_policy_steps >= 1`` the next batch is collected
  while this one trains (its sessions may straddle a weight swap; each sample's oldest policy version decides
  whether it is still fresh enough). With ``dynamic_sampling`` it draws more rounds until ``tasks_per_step``
  groups have rewards that differ (bounded); ``difficulty_filter`` and a reasoning-gym ``advance`` choose
  which tasks it draws (``polar.trainers.task_sampling``).
- The Learner is ``AgentTrainer``: the SFT stage first (``sft_warmup``, or the whole run for
  ``policy.type: sft``), which is the run's iteration 0, so an SFT run's checkpoint is ``ckpt_00000000.pt``;
  then one GRPO step per iteration: drop ERROR/CANCELLED sessions and stale groups, group-relative
  advantages, the clipped update against the engine's recorded logprobs
  (``polar.algorithms.grpo.GRPOLearner``), weights to the engine through the gateway's drain (pause, wait
  in-flight, swap, resume). A step with no usable group (all filtered, or equal rewards in every group)
  updates nothing, publishes nothing and is logged with ``update_skipped: 1``; with ``kl_coef > 0`` a group
  tied below the best reward seen so far stays in at advantage 0, so the KL to the reference still trains on
  it (one tied at the best reward is dropped: a KL-only pull would undo what was learned). With ``advantage:
  value_head`` the baseline is the learner's critic instead of the group (``return_batch``: each sample's
  return; any group size, equal rewards included); with ``value_head.freeze_llm`` only the head trains, so
  every step logs ``update_skipped: 1`` (the served weights and policy version stay).

Counters and metric names are the loop's: ``iteration`` (one GRPO step), ``env_steps`` (sessions rolled
out; one session is one episode), ``episode_reward_mean`` (the step's sessions), ``pg_loss``; ``step`` and
``reward_mean`` stay in the rows for the tools that read agent runs by those names.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from polar.algorithms.grpo import GRPOLearner
from polar.algorithms.sft import sft_train
from polar.config.run import AgentRunConfig
from polar.errors import ConfigError
from polar.metrics.logger import EpisodeWindow
from polar.rollout.sessions.session import SessionResult
from polar.trainers.agentic_run import build_stack, heldout_success, load_tasks, policy_options, resolve
from polar.trainers.legacy_loop import Metrics, OnIteration, TrainingLoop
from polar.trainers.lifecycle import run_guard
from polar.trainers.llm_trainer import best_reward, group_batch, has_signal, return_batch, reward_range
from polar.trainers.run_dir import RunDir
from polar.trainers.session_stats import live_counts, session_metrics
from polar.trainers.task_sampling import Curriculum, TaskDifficulty
from polar.types import Batch

log = logging.getLogger(__name__)

# below this share of groups with a signal per step, the run says so and suggests what helps
LOW_SIGNAL_SHARE = 0.25

Groups = list[list[SessionResult]]


class SessionCollector:
    """The Collector of agent runs: one batch is ``tasks_per_step`` groups of ``group_size`` sessions of tasks
    drawn without replacement (reshuffled when all were drawn) from a local rollout stack (``LocalStack``, or
    anything with ``run_groups`` / ``update_weights``).

    ``batches`` is how many batches the run still needs: with ``prefetch`` the next one is submitted as soon as
    this one arrived, but never one past the end. While a batch is collected it logs its sessions' progress
    every ``HEARTBEAT_S``; each batch adds the session rates of ``polar.trainers.session_stats`` and the
    sampled tokens per second of its collection to the step's metrics."""

    HEARTBEAT_S = 30.0

    def __init__(self, stack: Any, tasks: list[dict[str, Any]], tasks_per_step: int, group_size: int, seed: int,
                 batches: int, prefetch: bool, first_step: int = 0, max_extra_rounds: int = 0,
                 signal: Callable[[list[SessionResult]], bool] | None = None,
                 difficulty: TaskDifficulty | None = None, curriculum: Curriculum | None = None) -> None:
        self.stack = stack
        self.curriculum = curriculum
        self.max_extra_rounds = max_extra_rounds if signal is not None else 0
        self.signal = signal
        self.difficulty = difficulty
        self.tasks = list(tasks)
        self.tasks_per_step = tasks_per_step
        self.group_size = group_size
        self.rng = random.Random(seed)
        self.left = batches
        self.prefetch = prefetch
        self.step = first_step
        self.wait_s = 0.0
        self.batch_counts: Metrics = {}
        self._order: list[int] = []
        # the batch under way: its future, the step it is for, when it was submitted
        self._pending: tuple[concurrent.futures.Future[Groups], int, float] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="polar-collect")

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
        if self.prefetch and self.left > 0:
            self._pending = self._submit()

    def collect(self) -> Batch:
        t0 = time.monotonic()
        future, step, submitted = self._pending if self._pending is not None else self._submit()
        self._pending = None
        groups = self._wait(future, step, submitted)
        if self.difficulty is not None:
            self.difficulty.observe(groups)
        # (a prefetched batch carries the step it was submitted at as its rollout_step; the logs say the step it
        # trains, self.step)
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
                             **session_metrics(results)}
        return Batch(data=groups, env_steps=len(results),
                     episode_returns=[float(r.reward) for r in results if r.reward is not None],
                     episode_lengths=[len(r.samples) for r in results if r.reward is not None])

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        self.stack.update_weights(weights, version)

    def metrics(self) -> Metrics:
        stack_metrics = getattr(self.stack, "metrics", None)  # the Ray stack: its nodes, restarts, re-dispatches
        return {"collect_wait_s": round(self.wait_s, 3), **self.batch_counts,
                **(stack_metrics() if callable(stack_metrics) else {})}

    def close(self) -> None:
        if self._pending is not None:
            self._pending[0].cancel()  # a batch not yet started; one under way finishes (SIGTERM's grace bounds it)
        self._pool.shutdown(wait=True)


class AgentTrainer(TrainingLoop):
    """GRPO / SFT on an agent harness, through the one loop. ``engine``: an inference engine already loaded
    (tests, benchmarks) instead of the one the config names; ``collector``: a Collector factory
    ``(trainer) -> Collector`` to replace the local ``SessionCollector``; ``stack``: the rollout stack's
    builder, ``(cfg, run_dir_path, engine) -> stack`` (default ``build_stack``, the in-process one; the Ray
    learner actor passes ``build_ray_stack``: sessions on Ray gateway nodes)."""

    cfg: AgentRunConfig

    def __init__(self, cfg: AgentRunConfig, run_dir: RunDir, resume: bool = False, on_iteration: OnIteration | None = None,
                 extra_metrics: Metrics | None = None, engine: Any = None, collector: Any = None,
                 stack: Any = None) -> None:
        if cfg.policy.type not in ("grpo", "sft"):
            raise ConfigError(f"policy.type {cfg.policy.type!r}: agent harnesses train with 'grpo' or 'sft'")
        if cfg.policy.type == "grpo" and not cfg.tasks:
            raise ConfigError("policy grpo needs 'tasks: FILE.jsonl' (the prompts to roll out)")
        super().__init__(cfg, run_dir, resume, on_iteration, extra_metrics)
        self.kw: Any = cfg.policy.kwargs
        self.engine = engine
        self.collector_factory = collector
        self.stack_factory = stack or build_stack
        self.total_steps = int(self.kw.total_steps) if cfg.policy.type == "grpo" else 0
        if cfg.policy.type == "grpo":  # episode_reward_mean: the mean over one step's sessions
            self.window = EpisodeWindow(int(self.kw.tasks_per_step * self.kw.group_size))
        self.eval_tasks: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self._low_signal_steps = 0
        self.reward_range: tuple[float, float] | None = None  # of any usable session so far (best_reward)
        self.history: list[Metrics] = []
        self.stack: Any = None
        self.learner: GRPOLearner | None = None
        filt = getattr(self.kw, "difficulty_filter", None) if cfg.policy.type == "grpo" else None
        self.difficulty = TaskDifficulty(filt) if filt is not None else None
        advance = cfg.policy.type == "grpo" and getattr(cfg.tasks, "advance", None) is not None
        self.curriculum = Curriculum(cfg.tasks) if advance else None  # type: ignore[arg-type]

    # ------------------------------------------------------------------ build
    def finished(self) -> bool:
        return self.iteration >= self.total_steps

    def _build(self, state: dict[str, Any] | None) -> None:
        from polar.models.llm_policy import LLMPolicy

        cfg, kw = self.cfg, self.kw
        self.run_dir.update_meta(kind=f"agentic-{cfg.policy.type}")
        self.eval_tasks = load_tasks(cfg.eval_tasks, cfg.config_dir) if cfg.eval_tasks else []
        tasks = load_tasks(cfg.tasks, cfg.config_dir) if cfg.policy.type == "grpo" else []
        self.stack = self.stack_factory(cfg, self.run_dir.path, self.engine, training=True).__enter__()  # stopped by train()
        try:
            self.policy = LLMPolicy.from_engine(self.stack.engine, kw.lora, **policy_options(cfg))
            self.version = int(self.stack.engine.policy_version)
            if state is None:
                self._sft_warm_up()
            if cfg.policy.type == "grpo":
                self.summary["eval_before"] = self._eval_before(state)
                self.learner = GRPOLearner(self.policy, kw)
            if state is not None:
                self._load_state(state)
                self.stack.update_weights(self.policy.serving_state_dict(), self.version)  # the engine starts fresh
            if self.curriculum is not None and self.curriculum.advances:  # resumed past an advance: its levels
                tasks = self.curriculum.tasks()
            if self.collector_factory is not None:
                self.collector = self.collector_factory(self)
            else:
                grpo = cfg.policy.type == "grpo"
                # dynamic sampling fills a step with groups whose rewards differ; the critic's baseline needs none
                dynamic = grpo and kw.advantage != "value_head" and kw.dynamic_sampling.max_extra_rounds > 0
                overlong_filter = bool(grpo and kw.overlong_filter)
                self.collector = SessionCollector(
                    self.stack, tasks, kw.tasks_per_step if tasks else 1, kw.group_size if tasks else 1, cfg.seed,
                    batches=self.total_steps - self.iteration, prefetch=bool(tasks) and kw.max_off_policy_steps >= 1,
                    first_step=self.iteration,
                    max_extra_rounds=kw.dynamic_sampling.max_extra_rounds if dynamic else 0,
                    signal=(lambda g: has_signal(g, overlong_filter)) if dynamic else None,
                    difficulty=self.difficulty, curriculum=self.curriculum)
            self.collector.start(self.weights(), self.version)
        except BaseException:
            self.stack.__exit__(None, None, None)
            self.stack = None
            raise
        self._t_loop = time.monotonic()

    def _eval_before(self, state: dict[str, Any] | None) -> dict[str, Any]:
        """Held-out success of the weights GRPO starts from. A resumed run measured it when it first started
        (``eval/before_grpo.json``): it reads that instead of scoring the base weights again."""
        done = self.run_dir.path / "eval" / "before_grpo.json"
        if state is not None and done.is_file():
            try:
                return dict(json.loads(done.read_text()))
            except (OSError, ValueError) as e:
                log.warning("could not read %s (%s); evaluating the starting weights again", done, e)
        return self.evaluate("before_grpo", self.kw.eval_samples)

    def _sft_warm_up(self) -> None:
        """Behaviour cloning before RL (``sft_warmup``), or the whole of an SFT run: iteration 0 of the run."""
        from polar.models.llm_policy import load_demonstrations

        cfg, kw = self.cfg, self.kw
        sft = cfg.sft_warmup
        demos_path = sft.demonstrations if sft else (cfg.tasks if cfg.policy.type == "sft" else None)
        sft_kwargs = sft.kwargs if sft else (kw if cfg.policy.type == "sft" else None)
        if not demos_path or sft_kwargs is None:
            return
        if cfg.policy.type == "grpo" and sft_kwargs.lora is not None and kw.lora is None:
            raise ConfigError("sft_warmup.kwargs.lora is set but policy.kwargs.lora is not; use the same for both")
        demos = load_demonstrations(resolve(demos_path, cfg.config_dir), self.policy.tokenizer)
        ts = time.monotonic()

        def on_step(step: int, loss: float) -> None:
            if step % 10 == 0:
                self.logger.log({"sft_step": step, "sft_loss": loss}, step)

        losses = sft_train(self.policy, demos, sft_kwargs, cfg.seed, on_step=on_step)
        self.version += 1
        self.stack.update_weights(self.policy.serving_state_dict(), self.version)
        self.summary["sft"] = {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1],
                               "demonstrations": len(demos), "time_s": round(time.monotonic() - ts, 1)}
        log.info("SFT: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])

    def _warn_on_low_signal(self, counts: Metrics, group_size: int) -> None:
        """Say so when most groups carry no signal (GRPO learns only from groups whose rewards differ), with
        what helps; once at the first such step, then every 10th, so a long run's log stays readable. Groups
        tied at the best reward seen are left out: every session there did as well as any has, which is
        convergence, not a missing signal."""
        open_groups = counts.get("groups", 0) - counts.get("groups_tied_at_best", 0)
        share = counts.get("groups_used", 0) / open_groups if open_groups > 0 else 1.0
        if share >= LOW_SIGNAL_SHARE:
            return
        self._low_signal_steps += 1
        if self._low_signal_steps % 10 != 1:
            return
        log.warning("GRPO step %d: only %.0f%% of the groups carry a signal (rewards differ within the group; "
                    "the rest teach nothing). What helps: a larger group (policy.kwargs.group_size, now %d), "
                    "partial-credit rewards from the verifier, easier tasks or a curriculum, or an SFT warm-up "
                    "(sft_warmup) on demonstrations", self.iteration + 1, 100 * share, group_size)

    # ------------------------------------------------------------------ the Learner seam
    def update(self, batch: Batch) -> Metrics:
        assert self.learner is not None  # an SFT run has no GRPO iterations
        kw = self.kw
        t_learn = time.monotonic()
        if kw.advantage == "value_head":  # the learner's critic gives the baseline: each sample's return
            samples, returns, counts = return_batch(batch.data, self.version, kw.max_off_policy_steps,
                                                    kw.overlong_filter)
            upd = self.learner.update(samples, returns=returns) if samples else {}
        else:
            self.reward_range = reward_range(batch.data, self.reward_range)
            # Dr.GRPO drops the std as well as the length normalisation
            method = "mean" if kw.loss_aggregation == "dr_grpo" and kw.advantage == "mean_std" else kw.advantage
            samples, advs, counts = group_batch(batch.data, self.version, kw.max_off_policy_steps, method,
                                                kw.step_advantage, best=best_reward(self.reward_range),
                                                keep_tied=kw.kl_coef > 0, overlong_filter=kw.overlong_filter)
            upd = self.learner.update(samples, advs) if samples else {}
        # value_head.freeze_llm trains the head only: the served policy is unchanged, so nothing is published
        frozen = kw.value_head is not None and kw.value_head.freeze_llm
        if not samples:  # a step with no usable group changed no weight: no swap, no new version
            log.info("GRPO step %d: no usable group (%s); the weights and policy version stay", self.iteration + 1,
                     ", ".join(f"{k} {v:g}" for k, v in counts.items() if k.startswith("groups_")))
        self._warn_on_low_signal(counts, kw.group_size)
        if "policy_loss" in upd:
            upd["pg_loss"] = upd.pop("policy_loss")
        rewards = batch.episode_returns
        return {"samples": len(samples), "update_skipped": int(not samples or frozen),
                "reward_mean": sum(rewards) / max(1, len(rewards)),
                "learn_s": round(time.monotonic() - t_learn, 3), **counts, **upd}

    def weights(self) -> Mapping[str, Any]:
        return self.policy.serving_state_dict()

    def learner_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": self.policy.state_dict(), "step": self.iteration,
                                 "reward_range": list(self.reward_range) if self.reward_range else None}
        if self.difficulty is not None:
            state["task_difficulty"] = self.difficulty.state_dict()
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        if self.learner is not None:
            state.update(self.learner.state_dict())
        return state

    def load_learner_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["model"])
        seen = state.get("reward_range")  # None in checkpoints from before it was kept
        self.reward_range = (float(seen[0]), float(seen[1])) if seen else None
        if self.difficulty is not None and "task_difficulty" in state:  # absent: a run that drew tasks uniformly
            self.difficulty.load_state_dict(state["task_difficulty"])
        if self.curriculum is not None and "curriculum" in state:
            self.curriculum.load_state_dict(state["curriculum"])
        if self.learner is not None and "optimizer" in state:
            self.learner.load_state_dict(state)
        state.setdefault("iteration", state.get("step", 0))  # checkpoints written before the one loop

    def row_metrics(self, batches: list[Batch], stats: Metrics) -> Metrics:
        return {"step": self.iteration, "policy_version": self.version}

    def periodic_eval(self) -> Metrics:
        kw = self.kw
        if kw.eval_every and self.iteration % kw.eval_every == 0 and self.iteration < self.total_steps:
            res = self.evaluate(f"iter_{self.iteration:08d}", samples=kw.eval_samples, write=False)
            return {f"eval_{k}": v for k, v in res.items()}
        return {}

    def _end_iteration(self, batches: list[Batch], stats: Metrics, update_s: float, policy_lag: float | None) -> bool:
        done = super()._end_iteration(batches, stats, update_s, policy_lag)
        self.history.append({"reward_mean": stats["reward_mean"]})
        return done

    # ------------------------------------------------------------------ evaluation and the whole run
    def evaluate(self, tag: str = "final", episodes: int | None = None, samples: int | None = None,
                 write: bool = True) -> dict[str, Any]:
        """Held-out success over ``eval_tasks`` with the engine's current weights (``{}`` without eval_tasks)."""
        if not self.eval_tasks:
            return {}
        n = samples or episodes or int(getattr(self.kw, "eval_samples", 1))
        res: dict[str, Any] = heldout_success(self.stack, self.eval_tasks, n, tag)
        if write:
            self.run_dir.write_json(f"eval/{tag}.json", res)
            log.info("held-out success (%s): %.3f over %d sessions", tag, res["success"], res["sessions"])
        return res

    def train(self) -> dict[str, Any]:
        """The whole run; returns its summary (also written to ``eval/summary.json``): the loop's counts plus
        ``sft``, ``grpo``, ``eval_before`` / ``eval_after`` (GRPO) or ``eval_final`` (SFT)."""
        t0 = time.monotonic()
        try:
            result = super().train()
        finally:
            if self.stack is not None:
                self.stack.__exit__(None, None, None)
                self.stack = None
            for sink in (getattr(self, "logger", None), getattr(self, "observe", None)):
                if sink is not None:  # after the stack's threads stopped: they log until then
                    sink.close()
        summary = {**result, **self.summary}
        if self.cfg.policy.type == "grpo":
            summary["grpo"] = {"steps": self.iteration, "time_s": round(time.monotonic() - self._t_loop, 1)}
            if self.history:
                summary["grpo"]["reward_first"] = self.history[0]["reward_mean"]
                summary["grpo"]["reward_last"] = self.history[-1]["reward_mean"]
        summary["time_s"] = round(time.monotonic() - t0, 1)
        self.run_dir.write_json("eval/summary.json", summary)
        self.run_dir.update_meta(status="finished", result=summary)
        return summary

    def _close(self) -> None:
        """The loop's end: the collector stops; the logger and the log handlers stay open until the stack that
        the final evaluation still uses has stopped (``train``)."""
        self.collector.close()

    def final_eval(self) -> dict[str, Any]:
        if self.cfg.policy.type == "grpo":
            return {"eval_after": self.evaluate("after_grpo", samples=self.kw.eval_samples)}
        return {"eval_final": self.evaluate("final", samples=int(getattr(self.kw, "eval_samples", 1)))}


def train_agentic(cfg: AgentRunConfig, run_dir: RunDir, resume: bool = False, engine: Any = None) -> dict[str, Any]:
    """An agent run from start to end (``polar run`` does the same through ``polar.trainers.build``); returns its
    summary. ``run.json`` records this process as the run's owner and the run's final status, however it ends."""
    with run_guard(run_dir, cfg.logging.sigterm_grace_s):
        return AgentTrainer(cfg, run_dir, resume=resume, engine=engine).train()
