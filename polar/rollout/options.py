"""The Collector of hierarchical runs (``policy.type: hierarchical``), beside the env collector: it steps
``num_envs`` env copies in this process with a manager and its skills (options).

Each copy has an active skill or none. Before a step, every copy without one asks the manager (one batched
forward over those copies), which picks a skill; then every skill acts for the copies it runs (one forward per
skill). After the step, a copy's option ends when its skill's subgoal holds (the env's ``info["subgoal_<name>"]``),
when ``option_steps`` env steps have passed since the manager picked it, or when the episode ends; the manager
picks again before the copy's next step. So the manager decides every ``option_steps`` steps or sooner.

What is recorded (``polar.algorithms.hierarchical`` states the credit assignment):

- a manager decision: the observation it saw, the skill, its log-prob and value, the option's discounted return
  ``sum gamma^i r`` and its duration tau; it is complete once its option ends. A copy's decisions of one batch
  are one stream; the last one that is not an episode's end bootstraps from the value of the decision after it
  (already taken: the manager decides for the next batch at the end of this one), and a decision whose option
  is still running at the end of a batch waits for the next batch;
- a skill step: observation, action, log-prob, value, the skill's reward; an option execution ends its skill's
  episode (terminated at its subgoal or the env's end, truncated at ``option_steps`` or the env's time limit);
  one still running at the end of a batch is cut there and bootstraps from the skill's value.

Each policy's streams are packed end to end into one column: ``Fragment`` ``[steps, 1]`` per policy, every
stream ending in a terminated or truncated step, so GAE never crosses from one stream into another.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from polar.agents import check_act_output
from polar.algorithms.hierarchical import OptionRollout
from polar.buffers.rollout_buffer import RolloutBuffer
from polar.distributions import ACTION_MASK_KEY
from polar.errors import ConfigError
from polar.models.policy import Policy
from polar.rollout.episodes import obs_to_tensor, stack_obs
from polar.types import Batch, Fragment, Metrics, Rollout

log = logging.getLogger(__name__)

Obs = Any  # one copy's observation: an array, or a dict of arrays


@dataclass(frozen=True)
class Skill:
    """A skill as the collector runs it: its policy, the info key that ends it, what it is paid."""

    name: str
    policy: Policy
    subgoal: str | None  # the info key subgoal_<subgoal> ends it; None: only option_steps and episode ends
    reward: str  # "subgoal" | "extrinsic"
    where: str  # the config key, for errors: policy.kwargs.skills[i]
    requires: tuple[str, ...] = ()  # subgoals that must hold for the manager to pick it (initiation sets)


@dataclass
class Decision:
    """One manager decision: what it saw and chose, and its option's SMDP reward and duration so far."""

    obs: Obs
    option: int
    log_prob: float
    value: float
    ret: float = 0.0
    discount: float = 1.0
    tau: int = 0
    terminated: bool = False
    truncated: bool = False
    trunc_value: float = 0.0


@dataclass
class Step:
    """One skill step."""

    obs: Obs
    action: np.ndarray
    log_prob: float
    value: float
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    trunc_value: float = 0.0


@dataclass
class StepResult:
    """What one env step of all copies did (for the collector's records and for evaluation)."""

    rewards: np.ndarray
    done: np.ndarray
    successes: list[tuple[int, float]] = field(default_factory=list)  # (copy, success) of episodes that ended


def _index(obs: Any, idx: Any) -> Any:
    return {k: v[idx] for k, v in obs.items()} if isinstance(obs, dict) else obs[idx]


def _copy(obs: Obs) -> Obs:
    """A record's own copy of one observation (a vector env may reuse its arrays)."""
    return {k: np.array(v) for k, v in obs.items()} if isinstance(obs, dict) else np.array(obs)


def manager_observation_space(space: gym.Space[Any], num_skills: int, initiation_sets: bool) -> gym.Space[Any]:
    """The manager's observation space: the env's, plus an ``action_mask`` over the skills with initiation sets."""
    if not initiation_sets:
        return space
    mask = gym.spaces.Box(0, 1, (num_skills,), np.int8)
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({**space.spaces, ACTION_MASK_KEY: mask})
    return gym.spaces.Dict({"observation": space, ACTION_MASK_KEY: mask})


def _info_value(infos: Mapping[str, Any], key: str, i: int) -> Any:
    """Copy ``i``'s ``infos[key]`` (Gymnasium's ``key`` / ``_key`` layout), or None when it has none."""
    v = infos.get(key)
    if v is None:
        return None
    mask = infos.get(f"_{key}")
    if mask is not None and not bool(mask[i]):
        return None
    return v[i]


def _act(policy: Policy, obs: Any, n: int, space: gym.Space[Any], deterministic: bool
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Actions, log-probs and values of ``policy`` for a batch of ``n`` observations."""
    agent = policy.agent
    with torch.no_grad():
        action, _state, info = policy.act(obs_to_tensor(obs), None, deterministic)
        acts = check_act_output(agent, action, n, space)
        lp = info.get("log_prob")
        if lp is None:
            agent.action_dist.check(info, type(agent).__name__)
            lp = agent.action_dist.log_prob(info, torch.as_tensor(acts))
    values = info.get("values", info.get("value"))
    if values is None:
        raise ConfigError(f"{type(agent).__name__}.act() returned no 'values'; a hierarchical run trains it with PPO, "
                          "which needs a value head")
    return (acts, torch.as_tensor(lp).reshape(n).numpy().astype(np.float32),
            torch.as_tensor(values).reshape(n).numpy().astype(np.float32))


def _values(policy: Policy, obs: Any, n: int, space: gym.Space[Any]) -> np.ndarray:
    return _act(policy, obs, n, space, True)[2]


class OptionCollector:
    """Steps ``env`` with ``manager`` and ``skills`` (module docstring); ``collect`` returns ``steps_per_env``
    env steps of every copy as one ``Batch[OptionRollout]``. ``record: False`` (evaluation) keeps no records."""

    def __init__(self, env: gym.vector.VectorEnv[Any, Any, Any], manager: Policy, skills: Sequence[Skill],
                 option_steps: int, gamma: float, subgoal_reward: float, steps_per_env: int, seed: int | None,
                 env_name: str, initiation_sets: bool = True, record: bool = True) -> None:
        self.env = env
        self.manager = manager
        self.skills = list(skills)
        self.option_steps = option_steps
        self.gamma = gamma
        self.subgoal_reward = subgoal_reward
        self.steps_per_env = steps_per_env
        self.seed = seed
        self.env_name = env_name
        self.initiation_sets = initiation_sets
        self.record = record
        self.num_envs = env.num_envs
        self.obs_space = env.single_observation_space
        self.action_space = env.single_action_space
        self.option_space = gym.spaces.Discrete(len(self.skills))
        self.subgoal_names = sorted({s.subgoal for s in self.skills if s.subgoal is not None}
                                    | {r for s in self.skills for r in s.requires})
        self.manager_space = manager_observation_space(self.obs_space, len(self.skills), initiation_sets)
        n = self.num_envs
        self.active = np.full(n, -1, np.int64)  # the running skill per copy; -1: the manager picks before its next step
        self.tau = np.zeros(n, np.int64)  # env steps since the manager picked the running skill
        self.held: list[dict[str, bool]] = [{} for _ in range(n)]  # subgoals that hold now, per copy
        self.pending: list[Decision | None] = [None] * n  # the running option's decision
        self.decisions: list[list[Decision]] = [[] for _ in range(n)]  # complete decisions of this batch
        self.steps: list[dict[int, list[Step]]] = [{} for _ in range(n)]  # skill index -> its steps of this batch
        self.ep_ret = np.zeros(n)
        self.ep_len = np.zeros(n, np.int64)
        self.ep_ret_done = np.zeros(n)  # the returns and lengths as of the last step (those of episodes it ended)
        self.ep_len_done = np.zeros(n, np.int64)
        self.obs: Any = None
        self.checked_subgoals: set[str] = set()
        self.counts: np.ndarray = np.zeros(len(self.skills), np.int64)  # options picked since the last batch
        self.ended: np.ndarray = np.zeros(len(self.skills), np.int64)  # options ended since the last batch
        self.reached: np.ndarray = np.zeros(len(self.skills), np.int64)  # ... of those, at their subgoal
        self.option_lengths: list[int] = []

    # ------------------------------------------------------------------ the Collector protocol
    def start(self, weights: Mapping[str, Any], version: int) -> None:
        """Fresh episodes on every copy (a resumed run too: the options of the old episodes end with them)."""
        obs, infos = self.env.reset(seed=self.seed)
        self.obs = obs
        self.active[:] = -1
        self.tau[:] = 0
        self.pending = [None] * self.num_envs
        for i in range(self.num_envs):
            self.held[i] = self._subgoals(infos, i)

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        """Nothing to send: the copies act with the learner's own policy objects."""

    def metrics(self) -> Metrics:
        return {}

    def close(self) -> None:
        self.env.close()

    def state_dict(self) -> dict[str, Any]:
        """Which skill each copy runs and for how long (``-1``/``None``: the manager picks next)."""
        return {"options": {"active_skill": [self.skills[a].name if a >= 0 else None for a in self.active],
                            "option_age": [int(t) for t in self.tau]}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        opts = state.get("options")
        if opts is None:
            return
        names = [s.name for s in self.skills]
        active = opts["active_skill"]
        if len(active) != self.num_envs:  # a resume with another env count: every copy starts with the manager
            return
        self.active = np.array([names.index(a) if a in names else -1 for a in active], np.int64)
        self.tau = np.array(opts["option_age"], np.int64)

    def collect(self) -> Batch[OptionRollout]:
        t0 = time.perf_counter()
        rets: list[float] = []
        lens: list[int] = []
        succ: list[float] = []
        for _ in range(self.steps_per_env):
            res = self.step(deterministic=False)
            for i in np.flatnonzero(res.done):
                rets.append(float(self.ep_ret_done[i]))
                lens.append(int(self.ep_len_done[i]))
            succ.extend(s for _, s in res.successes)
        self.decide(deterministic=False)  # the next decisions: their values bootstrap this batch's last ones
        data = self._rollout()
        data.stats["options/collect_s"] = time.perf_counter() - t0
        return Batch(data, self.steps_per_env * self.num_envs, episode_returns=rets, episode_lengths=lens,
                     episode_successes=succ)

    # ------------------------------------------------------------------ acting
    def _subgoals(self, infos: Mapping[str, Any], i: int) -> dict[str, bool]:
        out = {}
        for name in self.subgoal_names:
            v = _info_value(infos, f"subgoal_{name}", i)
            out[name] = bool(v) if v is not None else False
        return out

    def _check_reported(self, infos: Mapping[str, Any]) -> None:
        """A subgoal the env never reports would leave its skill running until option_steps: refuse it."""
        for s in self.skills:
            if s.subgoal is None or s.subgoal in self.checked_subgoals:
                continue
            key = f"subgoal_{s.subgoal}"
            final = infos.get("final_info")
            if key not in infos and not (isinstance(final, Mapping) and key in final):
                raise ConfigError(f"{s.where}.subgoal {s.subgoal!r}: {self.env_name} reports no info[{key!r}] in its "
                                  f"step info; report it (True when the subgoal holds) or remove the subgoal")
            self.checked_subgoals.add(s.subgoal)

    def available(self, i: int) -> np.ndarray:
        """The skills copy ``i``'s manager may pick now: those whose subgoal does not hold yet and whose
        ``requires`` all hold (all of them when none qualifies, or without initiation sets)."""
        held = self.held[i]
        ok = np.array([(s.subgoal is None or not held.get(s.subgoal, False)) and all(held.get(r, False) for r in s.requires)
                       for s in self.skills], np.int8)
        return ok if ok.any() and self.initiation_sets else np.ones(len(self.skills), np.int8)

    def manager_obs(self, idx: np.ndarray) -> Any:
        """What the manager sees for copies ``idx``: the env observation, with the skills' mask when
        ``initiation_sets`` (a Box observation then goes under ``observation``)."""
        sub = _index(self.obs, idx)
        if not self.initiation_sets:
            return sub
        mask = np.stack([self.available(int(i)) for i in idx])
        return {**sub, ACTION_MASK_KEY: mask} if isinstance(sub, dict) else {"observation": sub, ACTION_MASK_KEY: mask}

    def decide(self, deterministic: bool) -> None:
        """The manager picks a skill for every copy that runs none."""
        idx = np.flatnonzero(self.active < 0)
        if idx.size == 0:
            return
        sub = self.manager_obs(idx)
        options, lps, values = _act(self.manager, sub, idx.size, self.option_space, deterministic)
        for j, i in enumerate(idx):
            o = int(options[j])
            self.active[i] = o
            self.tau[i] = 0
            self.counts[o] += 1
            if self.record:
                self.pending[i] = Decision(_copy(_index(sub, j)), o, float(lps[j]), float(values[j]))

    def step(self, deterministic: bool) -> StepResult:
        """One env step of every copy: the manager decides where due, the skills act, options end."""
        self.decide(deterministic)
        n = self.num_envs
        actions = np.empty((n, *self.action_space.shape), self.action_space.dtype)
        acted: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for k, skill in enumerate(self.skills):
            idx = np.flatnonzero(self.active == k)
            if idx.size:
                acts, lps, values = _act(skill.policy, _index(self.obs, idx), idx.size, self.action_space,
                                         deterministic)
                actions[idx] = acts
                acted[k] = (idx, acts, lps, values)
        env_actions = (np.clip(actions, self.action_space.low, self.action_space.high)
                       if isinstance(self.action_space, gym.spaces.Box) else actions)
        next_obs, rew, term, trunc, infos = self.env.step(env_actions)
        self._check_reported(infos)
        rew = np.asarray(rew, np.float64)
        term, trunc = np.asarray(term, bool), np.asarray(trunc, bool)
        done = term | trunc
        final_info = infos.get("final_info", {})
        if self.record:
            for k, (idx, acts, lps, values) in acted.items():
                for j, c in enumerate(idx):
                    self.steps[c].setdefault(k, []).append(Step(_copy(_index(self.obs, c)), acts[j], float(lps[j]),
                                                                float(values[j])))
        res = StepResult(rew, done)
        self.ep_ret += rew
        self.ep_len += 1
        self.ep_ret_done = self.ep_ret.copy()
        self.ep_len_done = self.ep_len.copy()
        ended_skill: list[tuple[int, int, Obs]] = []  # (copy, skill, obs to bootstrap from) of truncated skill episodes
        ended_manager: list[tuple[int, Obs]] = []  # (copy, final obs) of manager decisions cut by the time limit
        for i in range(n):
            k = int(self.active[i])
            skill = self.skills[k]
            self.tau[i] += 1
            now = self._subgoals(final_info if done[i] and isinstance(final_info, Mapping) else infos, i)
            held = skill.subgoal is not None and now.get(skill.subgoal, False)
            # it came to hold on this step (a subgoal that held before the step, and still does, pays nothing)
            reached = held and not (skill.subgoal is not None and self.held[i].get(skill.subgoal, False))
            ends = bool(held or self.tau[i] >= self.option_steps or done[i])
            final_obs = infos["final_obs"][i] if done[i] else None
            if self.record:
                step = self.steps[i][k][-1]
                if skill.reward == "subgoal":
                    step.reward = self.subgoal_reward if reached else 0.0
                else:
                    step.reward = float(rew[i])
                if held or term[i]:
                    step.terminated = True
                elif ends:  # out of option steps, or the env's time limit: bootstrap from the skill's value
                    step.truncated = True
                    ended_skill.append((i, k, final_obs if done[i] else _index(next_obs, i)))
                dec = self.pending[i]
                assert dec is not None  # decided before the step
                dec.ret += dec.discount * float(rew[i])
                dec.discount *= self.gamma
                dec.tau += 1
                if ends:
                    dec.terminated = bool(term[i])
                    dec.truncated = bool(trunc[i] and not term[i])
                    if dec.truncated:
                        ended_manager.append((i, final_obs))
                    self.decisions[i].append(dec)
                    self.pending[i] = None
            if ends:
                self.option_lengths.append(int(self.tau[i]))
                self.ended[k] += 1
                self.reached[k] += int(reached)
                self.active[i] = -1
            if done[i]:
                s = _info_value(final_info, "success", i) if isinstance(final_info, Mapping) else None
                if s is not None:
                    res.successes.append((i, float(bool(s))))
                self.ep_ret[i] = 0.0
                self.ep_len[i] = 0
            self.held[i] = self._subgoals(infos, i) if done[i] else now
        self._bootstrap(ended_skill, ended_manager)
        self.obs = next_obs
        return res

    def _bootstrap(self, ended_skill: list[tuple[int, int, Obs]], ended_manager: list[tuple[int, Obs]]) -> None:
        """Values of the observations truncated skill episodes and manager decisions bootstrap from."""
        by_skill: dict[int, list[tuple[int, Obs]]] = {}
        for i, k, o in ended_skill:
            by_skill.setdefault(k, []).append((i, o))
        for k, items in by_skill.items():
            values = _values(self.skills[k].policy, stack_obs([o for _, o in items], self.obs_space), len(items),
                             self.action_space)
            for (i, _), v in zip(items, values, strict=True):
                self.steps[i][k][-1].trunc_value = float(v)
        if ended_manager:
            finals = stack_obs([o for _, o in ended_manager], self.obs_space)
            if self.initiation_sets:
                mask: np.ndarray = np.ones((len(ended_manager), len(self.skills)), np.int8)
                finals = ({**finals, ACTION_MASK_KEY: mask} if isinstance(finals, dict)
                          else {"observation": finals, ACTION_MASK_KEY: mask})
            values = _values(self.manager, finals, len(ended_manager), self.option_space)
            for (i, _), v in zip(ended_manager, values, strict=True):
                self.decisions[i][-1].trunc_value = float(v)

    # ------------------------------------------------------------------ packing
    def _rollout(self) -> OptionRollout:
        """This batch's records as one ``Rollout`` per policy (module docstring), the records cleared."""
        # a skill episode still running is cut here: it bootstraps from the skill's value of the current obs
        running: dict[int, list[int]] = {}
        for i in range(self.num_envs):
            k = int(self.active[i])
            steps = self.steps[i].get(k)
            if k >= 0 and steps and not (steps[-1].terminated or steps[-1].truncated):
                running.setdefault(k, []).append(i)
        for k, copies in running.items():
            values = _values(self.skills[k].policy, _index(self.obs, np.array(copies)), len(copies), self.action_space)
            for i, v in zip(copies, values, strict=True):
                last = self.steps[i][k][-1]
                last.truncated, last.trunc_value = True, float(v)
        # a copy's last complete decision that is no episode end bootstraps from the decision after it
        for i in range(self.num_envs):
            decs, nxt = self.decisions[i], self.pending[i]
            if decs and not (decs[-1].terminated or decs[-1].truncated):
                assert nxt is not None  # collect decided for every copy at its end
                decs[-1].truncated, decs[-1].trunc_value = True, nxt.value
        manager_decisions = [d for i in range(self.num_envs) for d in self.decisions[i]]
        manager = _decision_rollout(manager_decisions, self.manager_space) if manager_decisions else None
        skills: dict[str, Rollout] = {}
        for k, skill in enumerate(self.skills):
            steps = [s for i in range(self.num_envs) for s in self.steps[i].get(k, [])]
            if steps:
                skills[skill.name] = _step_rollout(steps, self.obs_space)
        lengths = self.option_lengths
        total = max(1, int(self.counts.sum()))
        stats: Metrics = {"options/decisions": len(manager_decisions),
                          "options/length_mean": float(np.mean(lengths)) if lengths else float("nan")}
        stats.update({f"options/picked/{s.name}": float(self.counts[k]) / total for k, s in enumerate(self.skills)})
        stats.update({f"options/reached/{s.name}": float(self.reached[k]) / max(1, int(self.ended[k]))
                      for k, s in enumerate(self.skills) if s.subgoal is not None})
        self.decisions = [[] for _ in range(self.num_envs)]
        self.steps = [{} for _ in range(self.num_envs)]
        self.counts[:] = 0
        self.ended[:] = 0
        self.reached[:] = 0
        self.option_lengths = []
        return OptionRollout(manager, skills, stats)


def _column(values: Sequence[float], dtype: type[np.generic] = np.float32) -> np.ndarray:
    out: np.ndarray = np.asarray(values, dtype).reshape(-1, 1)
    return out


def _obs_column(items: Sequence[Obs], space: gym.Space[Any]) -> Any:
    stacked = stack_obs(list(items), space)
    if isinstance(stacked, dict):
        return {k: v[:, None] for k, v in stacked.items()}
    return stacked[:, None]


def _fragment(obs: Any, actions: np.ndarray, log_probs: Sequence[float], values: Sequence[float],
              rewards: Sequence[float], terminated: Sequence[bool], truncated: Sequence[bool],
              trunc_values: Sequence[float], durations: np.ndarray | None = None) -> Fragment:
    n = len(rewards)
    starts: np.ndarray = np.zeros((n, 1), np.float32)
    starts[0] = 1.0
    return Fragment(obs=obs, actions=actions, log_probs=_column(log_probs), values=_column(values),
                    rewards=_column(rewards), terminated=_column(terminated), truncated=_column(truncated),
                    episode_starts=starts, trunc_values=_column(trunc_values), last_values=np.zeros(1, np.float32),
                    durations=durations)


def _rollout_of(frag: Fragment) -> Rollout:
    return Rollout([frag], buffer=RolloutBuffer([frag]))


def _decision_rollout(decisions: Sequence[Decision], space: gym.Space[Any]) -> Rollout:
    frag = _fragment(_obs_column([d.obs for d in decisions], space),
                     np.asarray([d.option for d in decisions], np.int64).reshape(-1, 1),
                     [d.log_prob for d in decisions], [d.value for d in decisions], [d.ret for d in decisions],
                     [d.terminated for d in decisions], [d.truncated for d in decisions],
                     [d.trunc_value for d in decisions], _column([d.tau for d in decisions]))
    return _rollout_of(frag)


def _step_rollout(steps: Sequence[Step], space: gym.Space[Any]) -> Rollout:
    actions = np.stack([s.action for s in steps])[:, None]
    frag = _fragment(_obs_column([s.obs for s in steps], space), actions, [s.log_prob for s in steps],
                     [s.value for s in steps], [s.reward for s in steps], [s.terminated for s in steps],
                     [s.truncated for s in steps], [s.trunc_value for s in steps])
    return _rollout_of(frag)


def play_option_episodes(collector: OptionCollector, episodes: int, deterministic: bool,
                         max_steps: int = 100_000) -> dict[str, Any]:
    """Evaluation: ``episodes`` whole episodes split evenly over the copies (as ``evaluate_policy``), so short
    episodes do not crowd out long ones; return, length and success (when the env reports it), and how often
    the manager picked each skill."""
    n = collector.num_envs
    quota = [episodes // n + (1 if i < episodes % n else 0) for i in range(n)]
    returns: list[float] = []
    lengths: list[int] = []
    successes: list[float] = []
    collector.start({}, 0)
    for _ in range(max_steps):
        if not any(quota):
            break
        res = collector.step(deterministic)
        success = dict(res.successes)
        for i in map(int, np.flatnonzero(res.done)):
            if quota[i] > 0:
                quota[i] -= 1
                returns.append(float(collector.ep_ret_done[i]))
                lengths.append(int(collector.ep_len_done[i]))
                if i in success:
                    successes.append(success[i])
    total = max(1, int(collector.counts.sum()))
    picked = {s.name: float(collector.counts[k]) / total for k, s in enumerate(collector.skills)}
    return {"episodes": len(returns), "return_mean": float(np.mean(returns)) if returns else None,
            "return_std": float(np.std(returns)) if returns else None,
            "length_mean": float(np.mean(lengths)) if lengths else None,
            "success_rate": float(np.mean(successes)) if successes else None,
            "option_length_mean": float(np.mean(collector.option_lengths)) if collector.option_lengths else None,
            "picked": picked, "deterministic": deterministic, "returns": returns, "lengths": lengths}


__all__ = ["Decision", "OptionCollector", "Skill", "Step", "manager_observation_space", "play_option_episodes"]
