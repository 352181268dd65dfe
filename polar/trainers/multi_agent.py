"""PettingZoo runs (``harness: {type: pettingzoo}``): the training loop composed of the multi-agent collector
(``polar.rollout.backends.multi_agent``) and one unchanged ``PPOLearner`` per policy of ``harness.policy_mapping``.

Each batch holds one fragment per policy; each policy's learner updates on its own fragment. With
``self_play``, a frozen copy of the learner joins the opponent pool every ``snapshot_every_n_iterations``;
every evaluation plays the learner against a uniformly random legal player and against the pool and logs the
win rates (``eval/vs_random/win_rate``, ``eval/vs_pool/win_rate``, ...).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from polar.buffers.rollout_buffer import RolloutBuffer
from polar.config.multi_agent import PettingZooHarnessConfig
from polar.config.ppo import PPOKwargs
from polar.config.run import EnvRunConfig
from polar.errors import ConfigError
from polar.harness.pettingzoo_env import agent_spaces, make_pettingzoo_env
from polar.models.policy import Policy, build_policy
from polar.rollout.backends.multi_agent import (
    MultiAgentCollector,
    Seat,
    play_games,
    policy_spaces,
    resolve_mapping,
)
from polar.rollout.self_play import OpponentPool
from polar.trainers.checkpoint import CheckpointManager
from polar.trainers.env_run import AlgorithmLearner
from polar.trainers.loop import OnIteration, TrainingLoop, env_steps_budget
from polar.trainers.registry import ppo_learner
from polar.trainers.run_dir import RunDir
from polar.types import Batch, Fragment, Metrics, Progress, Rollout

log = logging.getLogger(__name__)


def check_multi_agent_config(cfg: EnvRunConfig) -> PettingZooHarnessConfig:
    """What a PettingZoo run cannot do yet, refused at start with the key to change."""
    h = cfg.harness
    assert isinstance(h, PettingZooHarnessConfig)
    if not isinstance(cfg.policy.kwargs, PPOKwargs):  # one PPOLearner per policy
        raise ConfigError(f"policy.type {cfg.policy.type!r}: harness.type pettingzoo trains with ppo")
    kw = cfg.policy.kwargs
    if kw.normalize_obs or kw.normalize_reward:
        raise ConfigError("policy.kwargs.normalize_obs / normalize_reward: not supported with harness.type pettingzoo; "
                          "set them to false")
    if getattr(cfg.agent, "type", None) not in ("mlp", "cnn"):
        raise ConfigError(f"agent.type {getattr(cfg.agent, 'type', None)!r}: harness.type pettingzoo runs the built-in "
                          "feed-forward agents (mlp, cnn)")
    if cfg.distribution.backend != "local" or cfg.distribution.rollout_workers != 0:
        raise ConfigError("distribution: harness.type pettingzoo steps its envs in the learner process; set "
                          "backend: local and rollout_workers: 0")
    if h.self_play is not None and len(set(h.policy_mapping.values())) > 1:
        raise ConfigError("harness.self_play trains one policy against its past copies; leave policy_mapping empty "
                          "(all agents share the learner)")
    return h


def evaluate_multi_agent(cfg: EnvRunConfig, policies: dict[str, Policy], mapping: dict[str, str],
                         pool: OpponentPool | None, games: int, seed: int, deterministic: bool) -> dict[str, Any]:
    """Per-agent returns and win/draw/loss with every agent played by its policy; against a random legal player
    (each policy at each of its agents in turn, the others random); and against each pool snapshot in turn."""
    h = cfg.harness
    assert isinstance(h, PettingZooHarnessConfig)
    agents = list(mapping)

    def own(g: int) -> dict[str, Seat]:
        return {a: Seat("learn", mapping[a]) for a in agents}

    def vs_random(g: int) -> dict[str, Seat]:
        learner = agents[g % len(agents)]
        return {a: Seat("learn", mapping[a]) if a == learner else Seat("random") for a in agents}

    where = cfg.config_dir
    res: dict[str, Any] = {"per_agent": play_games(h, own, policies, mapping, games, seed, deterministic,
                                                   config_dir=where).summary(),
                           "vs_random": play_games(h, vs_random, policies, mapping, games, seed + 1, deterministic,
                                                   scored=lambda g: agents[g % len(agents)],
                                                   config_dir=where).summary()}
    if pool is not None and pool.snapshots:
        snaps = pool.snapshots

        def vs_pool(g: int) -> dict[str, Seat]:
            learner, snap = agents[g % len(agents)], snaps[(g // len(agents)) % len(snaps)]
            return {a: Seat("learn", mapping[a]) if a == learner else Seat("pool", snapshot=snap) for a in agents}

        res["vs_pool"] = play_games(h, vs_pool, policies, mapping, games, seed + 2, deterministic,
                                    scored=lambda g: agents[g % len(agents)], config_dir=where).summary()
    return res


def eval_metrics(res: dict[str, Any]) -> Metrics:
    """The metrics row's view of an evaluation: win rates against the random player and the pool, per-agent returns."""
    out: Metrics = {}
    for part in ("vs_random", "vs_pool"):
        learner = res.get(part, {}).get("learner")
        if learner is not None:
            for k in ("win_rate", "draw_rate", "loss_rate", "win_or_draw_rate"):
                out[f"eval/{part}/{k}"] = learner[k]
    for agent, r in res["per_agent"]["return_mean"].items():
        out[f"eval/return_mean/{agent}"] = r
    return out


class MultiPolicyLearner:
    """One unchanged ``PPOLearner`` per policy, each updated on its own fragment of the batch; with ``self_play``, a
    frozen copy of the learner joins the opponent pool every ``snapshot_every_n_iterations`` iterations."""

    def __init__(self, harness: PettingZooHarnessConfig, policies: dict[str, Policy],
                 learners: dict[str, AlgorithmLearner[Rollout]],
                 pool: OpponentPool | None) -> None:
        self.harness = harness
        self.policies = policies
        self.learners = learners
        self.pool = pool

    def update(self, batch: Batch[dict[str, Fragment]]) -> Metrics:
        stats: Metrics = {}
        for name, frag in batch.data.items():
            own = Batch(Rollout([frag], buffer=RolloutBuffer([frag])), frag.env_steps, run_env_steps=batch.run_env_steps,
                        iteration=batch.iteration, version=batch.version)
            st = self.learners[name].update(own)
            stats.update(st if len(batch.data) == 1 else {f"{name}/{k}": v for k, v in st.items()})
        sp = self.harness.self_play
        if sp is not None and self.pool is not None and batch.iteration % sp.snapshot_every_n_iterations == 0:
            (policy,) = self.policies.values()
            self.pool.add(policy.state_dict(), batch.iteration)
        return stats

    def weights(self) -> Mapping[str, Any]:
        return {}  # the collector acts with the learner's own policy objects

    def state_dict(self) -> dict[str, Any]:
        return {"policies": {n: p.state_dict() for n, p in self.policies.items()},
                "learners": {n: lr.state_dict() for n, lr in self.learners.items()},
                "pool": self.pool.state_dict() if self.pool is not None else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for n, p in self.policies.items():
            p.load_state_dict(state["policies"][n])
            self.learners[n].load_state_dict(state["learners"][n])
        if self.pool is not None and state.get("pool") is not None:
            self.pool.load_state_dict(state["pool"])


class MultiAgentEvaluator:
    """Every ``eval.every_n_iterations`` iterations and at the end: ``evaluate_multi_agent`` (win rates against
    the random player and the pool, per-agent returns), written to ``eval/<tag>.json``."""

    def __init__(self, cfg: EnvRunConfig, run_dir: RunDir, learner: MultiPolicyLearner,
                 mapping: dict[str, str]) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.learner = learner
        self.mapping = mapping

    def evaluate(self, tag: str, progress: Progress) -> dict[str, Any]:
        ev, sp = self.cfg.eval, self.learner.harness.self_play
        games = sp.eval_games if sp is not None else ev.episodes
        res = evaluate_multi_agent(self.cfg, self.learner.policies, self.mapping, self.learner.pool, games, ev.seed,
                                   ev.deterministic)
        res.update(env_steps=progress.env_steps, iteration=progress.iteration)
        self.run_dir.write_json(f"eval/{tag}.json", res)
        return res

    def before(self, progress: Progress) -> dict[str, Any]:
        return {}

    def periodic(self, progress: Progress) -> Metrics:
        every = self.cfg.eval.every_n_iterations
        if every and progress.iteration % every == 0:
            return eval_metrics(self.evaluate(f"iter_{progress.iteration:08d}", progress))
        return {}

    def final(self, progress: Progress) -> dict[str, Any]:
        return {"eval": self.evaluate("final", progress)} if self.cfg.eval.at_end else {}


def compose_multi_agent(cfg: EnvRunConfig, run_dir: RunDir, *, resume: bool = False,
                        on_iteration: OnIteration | None = None,
                        extra_metrics: Metrics | None = None) -> TrainingLoop[dict[str, Fragment]]:
    """The loop of a PettingZoo run (module docstring); resumed from the newest checkpoint when ``resume``."""
    h = check_multi_agent_config(cfg)
    kw = cfg.policy.kwargs
    assert isinstance(kw, PPOKwargs)
    state = None
    if resume:
        ckpt, state = CheckpointManager(run_dir.checkpoints_dir, keep=cfg.logging.keep_checkpoints).load_newest()
        log.info("resuming from checkpoint %s", ckpt)
    torch.set_num_threads(1)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    probe = make_pettingzoo_env(h, cfg.config_dir, cfg.seed)
    try:
        agents = list(probe.possible_agents)
        spaces = agent_spaces(probe)
    finally:
        probe.close()
    mapping = resolve_mapping(h, agents)
    pspaces = policy_spaces(h, mapping, spaces)
    policies = {name: build_policy(cfg, obs, act, cfg.config_dir) for name, (obs, act) in pspaces.items()}
    learners = {name: ppo_learner(p.agent, kw, cfg.total_env_steps) for name, p in policies.items()}
    pool = None
    if h.self_play is not None:
        (_name, (obs, act)), = pspaces.items()
        pool = OpponentPool(h.self_play, lambda: build_policy(cfg, obs, act, cfg.config_dir), cfg.seed)
    learner = MultiPolicyLearner(h, policies, learners, pool)
    seed = cfg.seed if state is None else cfg.seed + 104_729 * (int(state["iteration"]) + 1)
    num_envs = cfg.distribution.num_envs
    collector = MultiAgentCollector(h, policies, mapping, int(kw.steps_per_env(num_envs * len(agents))), num_envs,
                                    seed, pool, config_dir=cfg.config_dir)
    return TrainingLoop(cfg, run_dir, collector, learner, MultiAgentEvaluator(cfg, run_dir, learner, mapping),
                        budget=env_steps_budget(cfg.total_env_steps), state=state,
                        on_iteration=on_iteration, extra_metrics=extra_metrics)


def load_multi_agent_policies(cfg: EnvRunConfig, state: dict[str, Any]) -> tuple[dict[str, Policy], dict[str, str],
                                                                                 OpponentPool | None]:
    """A checkpoint's policies (eval mode), the agent -> policy mapping and the opponent pool (``polar eval``)."""
    h = check_multi_agent_config(cfg)
    probe = make_pettingzoo_env(h, cfg.config_dir, cfg.seed)
    try:
        agents, spaces = list(probe.possible_agents), agent_spaces(probe)
    finally:
        probe.close()
    mapping = resolve_mapping(h, agents)
    pspaces = policy_spaces(h, mapping, spaces)
    policies = {}
    for name, (obs, act) in pspaces.items():
        policies[name] = build_policy(cfg, obs, act, cfg.config_dir)
        policies[name].load_state_dict(state["policies"][name])
        policies[name].eval()
    pool = None
    if h.self_play is not None and state.get("pool") is not None:
        (obs, act), = pspaces.values()
        pool = OpponentPool(h.self_play, lambda: build_policy(cfg, obs, act, cfg.config_dir), cfg.seed)
        pool.load_state_dict(state["pool"])
    return policies, mapping, pool
