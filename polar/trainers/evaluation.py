"""Evaluation: deterministic episodes on env instances of their own, with their own seeds.

The episodes are played by the one env-episode loop (``polar.rollout.episodes``); :class:`EnvEvaluator` is what
the training loop calls after an iteration and at the end of an env run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from polar.config.run import EnvHarnessConfig
from polar.rollout.episodes import ActingPolicy, EpisodePlan, PolicyActor, VectorSlots, run_episodes
from polar.types import Metrics, Progress

if TYPE_CHECKING:
    from polar.config.run import EnvRunConfig
    from polar.trainers.run_dir import RunDir


class EvaluatedPolicy(ActingPolicy, Protocol):
    def eval(self) -> object: ...


class ContinualMeasures(Protocol):
    """``polar.trainers.continual.Continual`` as the evaluator uses it (start, per-evaluation and final measures)."""

    def begin(self, state: Mapping[str, Any] | None, evaluate: Callable[[], dict[str, Any]]) -> None: ...

    def metrics(self, eval_result: dict[str, Any] | None) -> dict[str, Any]: ...

    def summary(self, final_eval: dict[str, Any] | None) -> dict[str, Any]: ...


class EvaluatedRun(Protocol):
    """What :class:`EnvEvaluator` reads of an env run's parts (``polar.trainers.env_run.EnvParts``)."""

    @property
    def cfg(self) -> EnvRunConfig: ...

    @property
    def run_dir(self) -> RunDir: ...

    @property
    def policy(self) -> EvaluatedPolicy: ...

    @property
    def state(self) -> Mapping[str, Any] | None: ...

    @property
    def continual(self) -> ContinualMeasures | None: ...

    def sync_acting_policy(self) -> None: ...


def evaluate_policy(policy: ActingPolicy, harness_cfg: EnvHarnessConfig, episodes: int = 20, seed: int = 10_000,
                    deterministic: bool = True, num_envs: int = 4, config_dir: Path | None = None,
                    max_episode_steps: int = 100_000) -> dict[str, Any]:
    """Run ``episodes`` episodes and report mean/std return, length and success rate (when the env
    reports ``info["success"]``). Episodes are split evenly over the envs (as SB3's evaluate_policy),
    so short episodes do not crowd out long ones."""
    from polar.harness import make_vector_env

    num_envs = max(1, min(num_envs, episodes))
    slots = VectorSlots(make_vector_env(harness_cfg, num_envs, seed=seed, config_dir=config_dir))
    try:
        results = run_episodes(PolicyActor(policy), slots, EpisodePlan.split(episodes, num_envs, seed),
                               deterministic=deterministic, max_episode_steps=max_episode_steps)
    finally:
        slots.close()
    returns = [r.ret for r in results]
    lengths = [r.length for r in results]
    # the success the env reports when it ends an episode (a cut episode has none)
    successes = [float(r.success) for r in results if r.success is not None and not r.cut]
    return {
        "episodes": len(returns),
        "return_mean": float(np.mean(returns)),
        "return_std": float(np.std(returns)),
        "length_mean": float(np.mean(lengths)),
        "success_rate": float(np.mean(successes)) if successes else None,
        "deterministic": deterministic,
        "seed": seed,
        "returns": returns,
        "lengths": lengths,
    }


class EnvEvaluator:
    """An env run's ``Evaluator`` (``polar.types``): deterministic episodes of the acting policy on fresh env
    copies (``eval``), apart from the training envs, every ``eval.every_n_iterations`` iterations and at the end
    (``eval.at_end``), each written to ``eval/<tag>.json``; with ``init`` or ``eval.old_tasks``, the start
    measurement before the first iteration and forgetting after each evaluation (``polar.trainers.continual``).
    ``row_fields``: ``eval/return_mean`` joins the metrics row even without continual (offline runs);
    ``counters``: extra fields of each result (offline runs: the gradient steps)."""

    def __init__(self, parts: EvaluatedRun, row_fields: bool = False) -> None:
        self.parts = parts
        self.row_fields = row_fields
        self.counters: Callable[[], dict[str, Any]] = dict

    def evaluate(self, tag: str, progress: Progress) -> dict[str, Any]:
        parts = self.parts
        ev = parts.cfg.eval
        parts.sync_acting_policy()
        parts.policy.eval()
        res = evaluate_policy(parts.policy, parts.cfg.harness, ev.episodes, ev.seed, ev.deterministic, ev.num_envs,
                              parts.cfg.config_dir)
        res.update(env_steps=progress.env_steps, iteration=progress.iteration, **self.counters())
        parts.run_dir.write_json(f"eval/{tag}.json", res)
        return res

    def before(self, progress: Progress) -> dict[str, Any]:
        continual = self.parts.continual
        if continual is not None:
            continual.begin(self.parts.state, lambda: self.evaluate("start", progress))
        return {}

    def periodic(self, progress: Progress) -> Metrics:
        every = self.parts.cfg.eval.every_n_iterations
        if every and progress.iteration % every == 0:
            res = self.evaluate(f"iter_{progress.iteration:08d}", progress)
            if self.parts.continual is not None:  # eval/return_mean, old_task/return, forgetting
                return self.parts.continual.metrics(res)
            if self.row_fields:
                return {"eval/return_mean": res.get("return_mean")}
        return {}

    def final(self, progress: Progress) -> dict[str, Any]:
        out = {"eval": self.evaluate("final", progress)} if self.parts.cfg.eval.at_end else {}
        if self.parts.continual is not None:
            out["continual"] = self.parts.continual.summary(out.get("eval"))
        return out
