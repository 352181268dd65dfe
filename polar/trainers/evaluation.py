"""Evaluation: deterministic episodes on env instances of their own, with their own seeds.

The episodes are played by the one env-episode loop (``polar.rollout.episodes``); :class:`EnvEvaluator` is what
the training loop calls after an iteration and at the end of an env run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from polar.config.run import EnvHarnessConfig
from polar.config.sections import EvalConfig
from polar.rollout.episodes import ActingPolicy, EpisodePlan, PolicyActor, VectorSlots, run_episodes


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
    successes = [float(r.success) for r in results if r.success is not None]
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
    """An env run's evaluation: ``eval.episodes`` episodes of the acting policy on fresh env copies seeded from
    ``eval.seed``, apart from the training envs. ``before`` runs first (e.g. copy the learner's weights into the
    acting policy, or put it in eval mode)."""

    def __init__(self, harness: EnvHarnessConfig, eval_cfg: EvalConfig, policy: ActingPolicy,
                 config_dir: Path | None = None, before: Callable[[], None] | None = None) -> None:
        self.harness, self.eval_cfg, self.policy = harness, eval_cfg, policy
        self.config_dir, self.before = config_dir, before

    def evaluate(self, tag: str, counters: Mapping[str, int], episodes: int | None = None) -> dict[str, Any]:
        """The evaluation's summary (``evaluate_policy``'s) with ``counters`` (env_steps, iteration, ...) added;
        ``tag`` names it for the caller, which writes it to ``eval/<tag>.json``."""
        if self.before is not None:
            self.before()
        ev = self.eval_cfg
        res = evaluate_policy(self.policy, self.harness, episodes or ev.episodes, ev.seed, ev.deterministic,
                              ev.num_envs, self.config_dir)
        res.update(counters)
        return res
