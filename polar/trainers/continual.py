"""Continual learning for env runs (docs/offline.md, "Continual learning"): start an online run from earlier
weights (``init``), mix an old dataset into DQN/SAC's replay (``replay_mix``), and measure forgetting on old
tasks (``eval.old_tasks``).

What ``init.source`` transfers, by the source run's ``policy.type`` and this run's:

==========================  =================  ==================================================================
source                      into               what is copied
==========================  =================  ==================================================================
bc, iql, ppo, appo          ppo, appo          the whole agent, key for key (and the observation normalizer)
dqn, cql (Discrete)         dqn                the Q-network (the target network starts as its copy)
sac, cql (Box)              sac                the actor, the twin critics and their targets, the entropy coefficient
iql (Discrete actions)      dqn                IQL's first critic Q(s, .) as the Q-network
bc, ppo, appo (Discrete)    dqn                the actor's logits as initial Q-values (greedy = the old mode)
bc, iql, ppo, appo (Box)    sac                the actor (mean rescaled into tanh space, its log std); from iql
                                               also the critics (the action input rescaled to SAC's [-1, 1])
==========================  =================  ==================================================================

Every copied tensor must have the shape this run's network has; a mismatch fails before training with both
shapes and the key to change. Optimizers, schedules and counters start fresh: the new run counts its own env steps.
The copy goes through the run's ``Learner``: its ``state_dict()`` gives this run's tensors (``policy``, and the
algorithm's ``learner`` share: critics, target networks, entropy coefficient), the source's are written into a copy
of them, and ``load_state_dict()`` loads the result (the learner's device copy follows the acting policy).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from polar.buffers.replay_buffer import ReplayBuffer
from polar.config.agent import BuiltinAgentConfig
from polar.config.continual import old_task_harness, old_task_names
from polar.config.iql import IQLKwargs
from polar.config.run import EnvRunConfig
from polar.errors import ConfigError
from polar.models.policy import Policy
from polar.types import Learner

log = logging.getLogger(__name__)

ACTOR_CRITIC = "actor-critic"
Q_NETWORK = "q-network"  # DQN's (and discrete CQL's)
SQUASHED = "squashed-actor"  # SAC's (and continuous CQL's)
MANIFEST = "manifest.json"  # polar.deploy.runtime.MANIFEST (deploy sits above trainers: not imported)


def _family(policy_state: Mapping[str, Any]) -> str:
    """The network a policy's weights are: DQN's Q-network, SAC's squashed actor (CQL trains either), or the
    actor-critic agent (PPO/APPO, BC, IQL). The saved keys tell which, whatever algorithm trained them."""
    if any(k.startswith("agent.q_net.") for k in policy_state):
        return Q_NETWORK
    if any(k.startswith("agent.mu.") for k in policy_state):
        return SQUASHED
    return ACTOR_CRITIC


def _has_iql_critics(state: Mapping[str, Any]) -> bool:
    """An actor-critic source whose learner kept Q(s, a) critics (IQL's)."""
    return _family(state["policy"]) == ACTOR_CRITIC and "critics" in (state.get("learner") or {})


def _shape(t: Any) -> list[int]:
    return list(t.shape)


# ---------------------------------------------------------------------- the source checkpoint
def resolve_source(ref: str, config_dir: Path) -> Path:
    """The checkpoint file ``init.source`` names: a checkpoint file, a run directory (its latest checkpoint),
    or a ``polar export`` folder (its manifest names the run and checkpoint). Relative to the config file."""
    from polar.trainers.checkpoint import CheckpointManager

    p = Path(ref).expanduser()
    if not p.is_absolute():
        p = next((c for c in (config_dir / p, Path.cwd() / p) if c.exists()), config_dir / p)
    if p.is_file():
        return p
    if (p / MANIFEST).is_file():
        try:
            run = json.loads((p / MANIFEST).read_text())["run"]
            ckpt = Path(run["path"]) / "checkpoints" / run["checkpoint"]
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"init.source: {p / MANIFEST} does not name its run and checkpoint ({e}); give the "
                              "run directory it was exported from") from None
        if not ckpt.is_file():
            raise ConfigError(f"init.source: {p} was exported from {ckpt}, which is gone; an exported graph cannot "
                              "be trained further, so give a run directory or checkpoint that still exists")
        return ckpt
    if (p / "checkpoints").is_dir():
        latest = CheckpointManager(p / "checkpoints").latest()
        if latest is None:
            raise ConfigError(f"init.source: run {p} has no checkpoint yet; let it write one, or give another run")
        return latest
    raise ConfigError(f"init.source: {ref!r} is not a checkpoint file, run directory or polar export folder "
                      f"(looked at {p}); give the run directory of the offline or online run to start from")


def load_source(cfg: EnvRunConfig) -> tuple[EnvRunConfig, dict[str, Any], Path]:
    """(the source run's config, its checkpoint state, the checkpoint path) for ``cfg.init``."""
    from polar.trainers.checkpoint import load_checkpoint
    from polar.trainers.loading import resolve_target

    assert cfg.init is not None  # called for runs with init only
    ckpt = resolve_source(cfg.init.source, cfg.config_dir)
    _, src_cfg, _ = resolve_target(ckpt)
    if src_cfg.kind != "env":
        raise ConfigError(f"init.source: {ckpt} is an LLM agent run (policy.type {src_cfg.policy.type}); init starts "
                          "an env run from an env run's network")
    state = load_checkpoint(ckpt)
    if "policy" not in state:
        raise ConfigError(f"init.source: {ckpt} holds no policy weights; give an env run's checkpoint")
    return src_cfg, state, ckpt


# ---------------------------------------------------------------------- copying tensors
class _Transfer:
    """Checked copies into a target module; ``where`` names the source in errors."""

    def __init__(self, where: str, fix: str) -> None:
        self.where = where
        self.fix = fix
        self.copied = 0

    def check(self, name: str, src: torch.Tensor, dst: torch.Tensor, target_name: str | None = None) -> None:
        if tuple(src.shape) != tuple(dst.shape):
            raise ConfigError(f"init.source: {name} has shape {_shape(src)} in {self.where} but "
                              f"{target_name or name} has shape {_shape(dst)} in this run; {self.fix}")

    def copy(self, dst: torch.Tensor, src: torch.Tensor, name: str, target_name: str | None = None) -> None:
        self.check(name, src, dst, target_name)
        with torch.no_grad():
            dst.copy_(src.to(dst.dtype))
        self.copied += 1

    def params(self, dst_sd: dict[str, torch.Tensor], target_prefix: str,
               pairs: list[tuple[str, torch.Tensor]]) -> None:
        """Copy ``pairs`` (source name, tensor), in order, onto ``dst_sd``'s tensors under ``target_prefix``, in
        their saved order (these feed-forward stacks hold parameters only)."""
        dst = _under(dst_sd, target_prefix)
        if len(dst) != len(pairs):
            src_shapes = [_shape(t) for _, t in pairs]
            dst_shapes = [_shape(t) for _, t in dst]
            raise ConfigError(f"init.source: the network in {self.where} has {len(pairs)} tensors {src_shapes} but "
                              f"{target_prefix} here has {len(dst)} {dst_shapes}; {self.fix}")
        for (src_name, src), (dst_name, d) in zip(pairs, dst, strict=True):
            self.copy(d, src, src_name, dst_name)

def _under(sd: dict[str, torch.Tensor], prefix: str) -> list[tuple[str, torch.Tensor]]:
    """The tensors of ``sd`` under ``prefix.``, in their saved (registration) order."""
    return [(k, v) for k, v in sd.items() if k.startswith(prefix + ".")]


def _check_activation(src_act: str, dst_act: str, where: str, fix: str) -> None:
    if src_act != dst_act:
        raise ConfigError(f"init.source: {where} uses {src_act} activations and this run's network {dst_act}; {fix}")


def _writable(sd: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a state dict whose tensors can be written without touching the modules they came from."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in sd.items()}


def apply_init(cfg: EnvRunConfig, learner: Learner[Any]) -> dict[str, Any]:
    """Load ``cfg.init.source``'s weights into a freshly built env run through its ``learner`` (``state_dict``
    in, the source's tensors written into a copy, ``load_state_dict`` out); returns what was copied (logged, and
    kept in the run's summary)."""
    from polar.models.off_policy import network_settings

    src_cfg, state, ckpt = load_source(cfg)
    src_type, dst_type = src_cfg.policy.type, cfg.policy.type
    sd = state["policy"]
    current = learner.state_dict()
    dst_sd: dict[str, torch.Tensor] = _writable(current["policy"])
    dst_learner: dict[str, Any] = dict(current.get("learner") or {})
    src_fam, dst_fam = _family(sd), _family(dst_sd)
    where = f"{ckpt} (policy.type {src_type})"
    report: dict[str, Any] = {"source": str(ckpt), "source_policy": src_type}
    if dst_fam != ACTOR_CRITIC and any(k.startswith("obs_norm.") for k in sd):
        raise ConfigError(f"init.source: {where} normalises observations (policy.kwargs.normalize_obs) and "
                          f"{dst_type} has no observation normaliser, so its weights would see raw inputs; continue "
                          "with ppo or appo (normalize_obs: true), or train the source with normalize_obs: false")

    if src_fam == dst_fam:
        fix = (f"give this run the source's network: its agent section was {src_cfg.agent.model_dump(mode='json')}")
        t = _Transfer(where, fix)
        skip = {"agent.epsilon", "agent.explore_uniform"}  # set by this run's exploration schedule
        src_norm = any(k.startswith("obs_norm.") for k in sd)
        dst_norm = any(k.startswith("obs_norm.") for k in dst_sd)
        if src_norm != dst_norm:
            raise ConfigError(f"init.source: {where} {'normalises' if src_norm else 'does not normalise'} observations "
                              f"and this run {'does' if dst_norm else 'does not'}: its weights expect "
                              f"{'normalised' if src_norm else 'raw'} inputs; set policy.kwargs.normalize_obs: "
                              f"{str(src_norm).lower()}")
        missing = sorted(k for k in dst_sd if k not in sd and k not in skip)
        extra = sorted(k for k in sd if k not in dst_sd and k not in skip)
        if missing or extra:
            raise ConfigError(f"init.source: the agent in {where} has other layers than this run's (only in this run: "
                              f"{missing[:4]}; only in the source: {extra[:4]}); {fix}")
        for k, v in dst_sd.items():
            if k not in skip:
                t.copy(v, sd[k], k)
        report["copied"] = "agent"
        if dst_fam == SQUASHED:
            _sac_critics_from_sac(dst_learner, state.get("learner") or {}, where, t)
            report["copied"] = "actor, critics, entropy coefficient"
        report["tensors"] = t.copied
    elif dst_fam == Q_NETWORK and src_fam == ACTOR_CRITIC:
        activation = network_settings(cfg)[1]
        if _has_iql_critics(state):
            critic_hidden = _iql_critic_hidden(src_cfg)
            t = _Transfer(where, f"set agent.hidden_sizes: {critic_hidden} (the IQL critic's critic_hidden) and "
                                 "agent.activation: relu")
            _check_activation("relu", activation, f"the IQL critic of {where}", t.fix)
            pairs = _under(state["learner"]["critics"], "0")
            report["copied"] = "IQL critic Q(s, .) as the Q-network"
        else:
            src_agent = _builtin_feedforward(src_cfg, where, "DQN")
            t = _Transfer(where, f"set agent.hidden_sizes: {list(src_agent.hidden_sizes)} and agent.activation: "
                                 f"{src_agent.activation} (the source agent's)")
            _check_activation(src_agent.activation, activation, where, t.fix)
            pairs = _under(sd, "agent.pi_encoder") + _under(sd, "agent.pi_head")
            report["copied"] = "actor logits as initial Q-values"
        t.params(dst_sd, "agent.q_net", pairs)
        report["tensors"] = t.copied
    elif dst_fam == SQUASHED and src_fam == ACTOR_CRITIC:
        report.update(_sac_from_actor_critic(cfg, dst_sd, dst_learner, src_cfg, state, where))
    else:
        raise ConfigError(f"init.source: a {src_type} checkpoint cannot start a {dst_type} run ({where}): "
                          f"{_what_starts(dst_type, dst_fam)}")
    _sync_target(dst_sd, dst_learner)
    learner.load_state_dict({"policy": dst_sd, "learner": dst_learner})
    log.info("init: %s from %s (%s tensors)", report["copied"], ckpt, report.get("tensors"))
    return report


def _builtin_feedforward(src_cfg: EnvRunConfig, where: str, target: str) -> BuiltinAgentConfig:
    """The source's agent section, when it is a built-in feed-forward one (mlp, cnn)."""
    agent = src_cfg.agent
    if not isinstance(agent, BuiltinAgentConfig) or agent.type not in ("mlp", "cnn"):
        raise ConfigError(f"init.source: {where} has a {agent.type} agent; {target} starts from an mlp or cnn "
                          "actor only (its networks are feed-forward), or from a run of its own kind")
    return agent


def _iql_critic_hidden(src_cfg: EnvRunConfig) -> list[int]:
    """The hidden sizes of the IQL critics a source run kept."""
    kw = src_cfg.policy.kwargs
    assert isinstance(kw, IQLKwargs), kw  # only IQL's learner keeps critics beside an actor-critic agent
    return list(kw.critic_hidden)


def _what_starts(dst_type: str, dst_fam: str) -> str:
    if dst_fam == ACTOR_CRITIC:
        return f"{dst_type} starts from bc, iql, ppo or appo runs (the same actor-critic agent)"
    if dst_fam == Q_NETWORK:
        return f"{dst_type} starts from dqn or cql runs, or from bc, iql, ppo or appo runs on Discrete actions"
    return f"{dst_type} starts from sac or cql runs, or from bc, iql, ppo or appo runs on Box actions"


def _sac_critics_from_sac(dst_learner: dict[str, Any], src_learner: dict[str, Any], where: str, t: _Transfer) -> None:
    """SAC's critics, their targets and its entropy coefficient from a SAC or CQL (Box) learner's state."""
    for name in ("critics", "critic_target"):
        src_name = name if name in src_learner or name == "critics" else "target"  # CQL saves its targets as target
        if src_name not in src_learner:
            raise ConfigError(f"init.source: {where} has no SAC {name}; give a SAC or CQL run's checkpoint")
        dst = dst_learner[name] = _writable(dst_learner[name])
        for k, v in dst.items():
            if k not in src_learner[src_name]:
                raise ConfigError(f"init.source: the critics in {where} have no {k}; {t.fix}")
            t.copy(v, src_learner[src_name][k], f"learner.{src_name}.{k}")
    if dst_learner.get("log_ent_coef") is not None and src_learner.get("log_ent_coef") is not None:
        dst_learner["log_ent_coef"] = src_learner["log_ent_coef"].detach().clone()


def _sac_from_actor_critic(cfg: EnvRunConfig, dst_sd: dict[str, torch.Tensor], dst_learner: dict[str, Any],
                           src_cfg: EnvRunConfig, state: dict[str, Any], where: str) -> dict[str, Any]:
    """SAC's actor from a Gaussian actor-critic agent: the trunk as is, the mean mapped linearly into tanh space
    (``mu = (mean - bias) / scale``: exact for actions well inside the bounds), the state-independent log std as the
    log-std head's bias; from IQL also both critics, their action input rescaled to SAC's [-1, 1]."""
    from polar.models.off_policy import network_settings

    sd = state["policy"]
    if "agent.log_std" not in sd:
        raise ConfigError(f"init.source: {where} has no Gaussian actor (Box actions); SAC starts from an agent that "
                          "was trained on this Box action space")
    src_agent = _builtin_feedforward(src_cfg, where, "SAC")
    activation = network_settings(cfg)[1]
    t = _Transfer(where, f"set agent.hidden_sizes: {list(src_agent.hidden_sizes)} and agent.activation: "
                         f"{src_agent.activation} (the source agent's)")
    _check_activation(src_agent.activation, activation, where, t.fix)
    t.params(dst_sd, "agent.trunk", _under(sd, "agent.pi_encoder"))
    scale, bias = dst_sd["agent.action_scale"], dst_sd["agent.action_bias"]
    w, b = sd["agent.pi_head.weight"], sd["agent.pi_head.bias"]
    t.check("agent.pi_head.weight", w, dst_sd["agent.mu.weight"], "agent.mu.weight")
    t.copy(dst_sd["agent.mu.weight"], w / scale.unsqueeze(1), "agent.pi_head.weight", "agent.mu.weight")
    t.copy(dst_sd["agent.mu.bias"], (b - bias) / scale, "agent.pi_head.bias", "agent.mu.bias")
    log_std = sd["agent.log_std"].reshape(-1)
    dst_sd["agent.log_std.weight"].zero_()
    t.copy(dst_sd["agent.log_std.bias"], log_std - torch.log(scale), "agent.log_std", "agent.log_std.bias")
    report: dict[str, Any] = {"copied": "actor (mean rescaled into tanh space)"}
    if _has_iql_critics(state):
        critic_hidden = _iql_critic_hidden(src_cfg)
        tc = _Transfer(where, f"set agent.hidden_sizes: {critic_hidden} (the IQL critic's critic_hidden) and "
                              "agent.activation: relu; SAC's critics share the agent's hidden sizes")
        _check_activation("relu", activation, f"the IQL critics of {where}", tc.fix)
        critics = state["learner"]["critics"]
        dst_critics = dst_learner["critics"] = _writable(dst_learner["critics"])
        n_critics = len({k.split(".", 1)[0] for k in dst_critics})
        for i in range(n_critics):
            pairs = [(k, v.clone()) for k, v in _under(critics, str(i))]
            # IQL's first layer sees [obs, raw action]; SAC's sees [obs, (a - bias) / scale]: fold the rescaling in
            first_w, first_b = pairs[0][1], pairs[1][1]
            n_act = int(scale.numel())
            w_act = first_w[:, -n_act:]
            first_b += w_act @ dst_critics[f"{i}.action_bias"].cpu()
            first_w[:, -n_act:] = w_act * dst_critics[f"{i}.action_scale"].cpu()
            tc.params(dst_critics, f"{i}.head", pairs)
        dst_learner["critic_target"] = _writable(dst_critics)
        report["copied"] += ", IQL critics"
        t.copied += tc.copied
    else:
        log.warning("init: %s has no critics SAC can use; SAC's critics start fresh (expect a dip in return while "
                    "they learn)", where)
    report["tensors"] = t.copied
    return report


def _sync_target(dst_sd: Mapping[str, torch.Tensor], dst_learner: dict[str, Any]) -> None:
    """A Q-network's target network (the learner's ``target``) starts as a copy of the Q-network it got."""
    prefix = "agent.q_net."
    if "target" in dst_learner and any(k.startswith(prefix) for k in dst_sd):
        dst_learner["target"] = {k[len(prefix):]: v.clone() for k, v in dst_sd.items() if k.startswith(prefix)}


# ---------------------------------------------------------------------- replay mix
def old_replay(cfg: EnvRunConfig, observation_space: gym.Space, action_space: gym.Space) -> ReplayBuffer:
    """``replay_mix.dataset``'s transitions in a replay buffer of their own (checked against the env's spaces)."""
    from polar.datasets.minari import load_dataset

    assert cfg.replay_mix is not None  # called for runs with replay_mix only
    data = load_dataset(cfg.replay_mix.dataset, cfg.config_dir, observation_space, action_space,
                        where="replay_mix.dataset")
    buf = ReplayBuffer(len(data), observation_space, action_space, seed=cfg.seed + 1)
    actions = data.actions.astype(np.int64) if isinstance(action_space, gym.spaces.Discrete) else data.actions
    buf.add(data.obs, actions, data.rewards, data.next_obs, data.terminated)
    log.info("replay_mix: %d old transitions from %s, %.0f%% of every batch", len(buf), data.dataset_id,
             100 * cfg.replay_mix.ratio)
    return buf


# ---------------------------------------------------------------------- forgetting
class OldTasks:
    """``eval.old_tasks``: each evaluated like the run's own eval (same episodes, seed, determinism); the first
    measurement (before any online step) is the start, and ``forgetting = start - current`` (positive: worse)."""

    def __init__(self, cfg: EnvRunConfig) -> None:
        self.cfg = cfg
        tasks = cfg.eval.old_tasks
        self.names = old_task_names(cfg.harness, tasks)
        self.harnesses = [old_task_harness(cfg.harness, t) for t in tasks]
        self.start: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.start_eval: float | None = None  # the run's own task, at the start (runs with init)

    def measure(self, policy: Any) -> dict[str, float]:
        from polar.trainers.evaluation import evaluate_policy

        ev = self.cfg.eval
        out = {}
        for name, harness in zip(self.names, self.harnesses, strict=True):
            out[name] = float(evaluate_policy(policy, harness, ev.episodes, ev.seed, ev.deterministic, ev.num_envs,
                                              self.cfg.config_dir)["return_mean"])
        return out

    def begin(self, policy: Any) -> None:
        self.start = self.measure(policy)
        self.last = dict(self.start)
        for name, ret in self.start.items():
            log.info("old task %s: return %.4g at the start", name, ret)

    def metrics(self, policy: Any) -> dict[str, float]:
        """``old_task/return`` and ``forgetting`` (means over the old tasks) and each task's own."""
        self.last = self.measure(policy)
        out: dict[str, float] = {}
        for name, ret in self.last.items():
            out[f"old_task/{name}/return"] = ret
            out[f"forgetting/{name}"] = self.start[name] - ret
        out["old_task/return"] = float(np.mean(list(self.last.values())))
        out["forgetting"] = float(np.mean([self.start[n] - r for n, r in self.last.items()]))
        return out

    def summary(self) -> dict[str, Any]:
        tasks = {n: {"start": self.start[n], "final": self.last[n], "forgetting": self.start[n] - self.last[n]}
                 for n in self.names}
        return {"tasks": tasks, "old_task_return_start": float(np.mean(list(self.start.values()))),
                "old_task_return": float(np.mean(list(self.last.values()))),
                "forgetting": float(np.mean([t["forgetting"] for t in tasks.values()]))}

    def state_dict(self) -> dict[str, Any]:
        return {"start": dict(self.start), "last": dict(self.last), "start_eval": self.start_eval}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = {n: float(v) for n, v in state.get("start", {}).items()}
        self.last = {n: float(v) for n, v in state.get("last", {}).items()}
        self.start_eval = state.get("start_eval")
        if set(self.start) != set(self.names):
            raise ConfigError(f"eval.old_tasks: the checkpoint measured {sorted(self.start)} at the start, this "
                              f"config names {self.names}; resume with the old tasks the run started with")


# ---------------------------------------------------------------------- the env run's continual state
class Continual:
    """What an env run with ``init`` or ``eval.old_tasks`` keeps: the init report, the run's own eval return at
    the start, and the old tasks. ``polar.trainers.build`` calls ``apply`` on a fresh run before the collector
    starts; the evaluator calls ``begin`` before the first iteration, ``metrics`` with every periodic evaluation
    and ``summary`` at the end; its state travels in checkpoints (``polar resume`` keeps the start).
    ``acting()`` returns the acting policy with the learner's latest weights."""

    def __init__(self, cfg: EnvRunConfig, acting: Callable[[], Policy]) -> None:
        self.cfg = cfg
        self.acting = acting
        self.init: dict[str, Any] | None = None
        self.start_return: float | None = None
        self.old_tasks = OldTasks(cfg) if cfg.eval.old_tasks else None

    @classmethod
    def create(cls, cfg: EnvRunConfig, acting: Callable[[], Policy]) -> Continual | None:
        return cls(cfg, acting) if cfg.init is not None or cfg.eval.old_tasks else None

    def apply(self, learner: Learner[Any]) -> None:
        """A fresh run with ``init``: load the source's weights through the run's learner."""
        if self.cfg.init is not None:
            self.init = apply_init(self.cfg, learner)

    def begin(self, state: Mapping[str, Any] | None, evaluate: Callable[[], dict[str, Any]]) -> None:
        """Measure the start (the run's own task with ``evaluate``, and the old ones); a resumed run has it."""
        if state is not None:
            if self.old_tasks is not None and not self.old_tasks.start:  # old tasks added on resume (-o)
                log.warning("eval.old_tasks: the checkpoint has no start measurement of the old tasks; forgetting "
                            "counts from this resume instead")
                self.old_tasks.begin(self.acting())
            return
        if self.init is not None:
            self.start_return = float(evaluate()["return_mean"])
            log.info("init: eval return %.4g on this run's task at the start", self.start_return)
        if self.old_tasks is not None:
            self.old_tasks.begin(self.acting())

    def metrics(self, eval_result: dict[str, Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if eval_result is not None:
            out["eval/return_mean"] = eval_result.get("return_mean")
            if self.start_return is not None:
                out["eval/improvement"] = float(eval_result["return_mean"]) - self.start_return
        if self.old_tasks is not None:
            out.update(self.old_tasks.metrics(self.acting()))
        return out

    def summary(self, final_eval: dict[str, Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.init is not None:
            out["init"] = self.init
        if self.start_return is not None:
            out["start_return"] = self.start_return
            if final_eval is not None:
                out["final_return"] = float(final_eval["return_mean"])
                out["improvement"] = out["final_return"] - self.start_return
        if self.old_tasks is not None:
            self.old_tasks.metrics(self.acting())
            out["old_tasks"] = self.old_tasks.summary()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"init": self.init, "start_return": self.start_return,
                "old_tasks": None if self.old_tasks is None else self.old_tasks.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        self.init = state.get("init")
        self.start_return = state.get("start_return")
        if self.old_tasks is not None and state.get("old_tasks"):
            self.old_tasks.load_state_dict(state["old_tasks"])
