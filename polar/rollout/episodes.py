"""The one env-episode loop for whole episodes played outside training: evaluation (``polar eval``, the run's
own eval), the evaluation suite's env jobs, ``polar eval --record`` and ``polar collect``.

The collector's hot loop (``polar.rollout.runner``) steps fragments of ``T`` steps for the learner; everything
that wants *episodes* (a return, a length, a success, the frames, the transitions) goes through
:func:`iter_episodes` here, so a change to how an episode is played (the action conversion, the time limit,
Gymnasium's terminated/truncated, recurrent-state resets) is made once.

Two things vary between the callers and are passed in:

- **Where the episodes run** (:class:`EpisodeSlots`): :class:`EnvSlots`, single ``gymnasium.Env`` copies with no
  autoreset (the suite's wrapped envs, recording, where the final frame must be the final state), or
  :class:`VectorSlots`, one SAME_STEP-autoreset vector env (evaluation and ``polar collect``: ``make_vector_env``,
  one connector process for all copies).
- **Which episodes** (:class:`EpisodePlan`): ``EpisodePlan.seeded(seeds)``, episode ``k`` reset with ``seeds[k]`` on
  the first free copy, so its outcome depends on its seed and the policy only; or ``EpisodePlan.split(episodes,
  num_envs, seed)``, episodes spread evenly over the copies (as SB3's ``evaluate_policy``) after one vector reset
  with ``seed`` (copy ``i`` gets ``seed + i``), later episodes continuing each copy's seeded RNG.

What a caller keeps per step (frames, transitions) it takes from an :class:`EpisodeObserver`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import gymnasium as gym
import numpy as np
import torch

from polar.agents import AgentBase, State, check_act_output, reset_state

if TYPE_CHECKING:
    from pathlib import Path

    from polar.config.run import EnvHarnessConfig
    from polar.datasets.minari import Episode

# An observation as an env returns it: an array, or a dict of arrays for Dict spaces (batched: one row per copy).
Obs: TypeAlias = Any
TensorObs: TypeAlias = torch.Tensor | dict[str, torch.Tensor]
Info: TypeAlias = Mapping[str, Any]


# ---------------------------------------------------------------- what acts
class Actor(Protocol):
    """What plays the episodes: a policy with its recurrent-state bookkeeping (``PolicyActor`` wraps a
    ``polar.models.Policy``; the suite's ensembles implement it too)."""

    @property
    def agent(self) -> AgentBase: ...

    def get_initial_state(self, n: int) -> State: ...

    def reset_state(self, state: State, initial: State, starts: torch.Tensor) -> State: ...

    def act(self, obs: TensorObs, state: State, deterministic: bool = True) -> tuple[Any, State, Any]: ...


class ActingPolicy(Protocol):
    """A ``polar.models.Policy`` as the loop uses it (its agent and ``act``)."""

    @property
    def agent(self) -> AgentBase: ...

    def act(self, obs: TensorObs, state: State = None, deterministic: bool = False) -> tuple[Any, State, Any]: ...


class PolicyActor:
    """A ``Policy`` as an :class:`Actor`: its agent's initial state, rows reset where an episode starts."""

    def __init__(self, policy: ActingPolicy) -> None:
        self.policy = policy

    @property
    def agent(self) -> AgentBase:
        return self.policy.agent

    def get_initial_state(self, n: int) -> State:
        return self.policy.agent.get_initial_state(n)

    def reset_state(self, state: State, initial: State, starts: torch.Tensor) -> State:
        return reset_state(state, initial, starts)

    def act(self, obs: TensorObs, state: State, deterministic: bool = True) -> tuple[Any, State, Any]:
        return self.policy.act(obs, state, deterministic)


def obs_to_tensor(obs: Obs) -> TensorObs:
    if isinstance(obs, dict):
        return {k: torch.from_numpy(np.asarray(v)) for k, v in obs.items()}
    return torch.from_numpy(np.asarray(obs))


def stack_obs(items: Sequence[Obs], space: gym.Space[Any]) -> Obs:
    """One observation per copy, as a batch."""
    if isinstance(space, gym.spaces.Dict):
        return {k: np.stack([np.asarray(o[k]) for o in items]) for k in space.spaces}
    return np.stack([np.asarray(o) for o in items])


def to_env_actions(agent: AgentBase, action: Any, n: int, space: gym.Space[Any]) -> np.ndarray:
    """The actor's action batch as the env takes it: checked shape, clipped into a Box's bounds."""
    acts = check_act_output(agent, action, n, space)
    if isinstance(space, gym.spaces.Box):
        acts = np.clip(acts, space.low, space.high)
    return acts


# ---------------------------------------------------------------- where the episodes run
@dataclass
class Transition:
    """One copy's step: ``obs`` is the observation after it (the episode's final one when it ended)."""

    obs: Obs
    reward: float
    terminated: bool
    truncated: bool
    info: Info
    time_s: float = 0.0
    next_obs: Obs = None  # VectorSlots: the autoreset's first observation of the copy's next episode


class EpisodeSlots(Protocol):
    """``num_envs`` env copies the loop plays episodes on."""

    @property
    def num_envs(self) -> int: ...

    @property
    def action_space(self) -> gym.Space[Any]: ...  # one copy's

    @property
    def observation_space(self) -> gym.Space[Any]: ...

    @property
    def steps_all(self) -> bool:
        """True when every copy steps every step (a vector env), idle ones included."""
        ...

    def reset_all(self, seed: int) -> list[Obs]:
        """Reset every copy, copy ``i`` with ``seed + i``."""
        ...

    def reset(self, slot: int, seed: int | None) -> Obs:
        """Reset one copy; ``seed`` None continues its RNG."""
        ...

    def step(self, actions: np.ndarray, live: np.ndarray) -> list[Transition | None]:
        """Step the ``live`` copies (all of them for a vector env); one transition per stepped copy."""
        ...


def _env_action(acts: np.ndarray, i: int, space: gym.Space[Any]) -> Any:
    return acts[i].item() if isinstance(space, gym.spaces.Discrete) else acts[i]


class EnvSlots:
    """Single ``gymnasium.Env`` copies, no autoreset: a copy is stepped only while it plays an episode, and
    stays at its final state until the loop resets it (recording renders it there)."""

    steps_all = False

    def __init__(self, envs: Sequence[gym.Env[Any, Any]]) -> None:
        if not envs:
            raise ValueError("EnvSlots needs at least one env")
        self.envs = list(envs)

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    @property
    def action_space(self) -> gym.Space[Any]:
        return self.envs[0].action_space

    @property
    def observation_space(self) -> gym.Space[Any]:
        return self.envs[0].observation_space

    def reset_all(self, seed: int) -> list[Obs]:
        return [self.reset(i, seed + i) for i in range(self.num_envs)]

    def reset(self, slot: int, seed: int | None) -> Obs:
        obs, _ = self.envs[slot].reset(seed=seed)
        return obs

    def step(self, actions: np.ndarray, live: np.ndarray) -> list[Transition | None]:
        out: list[Transition | None] = [None] * self.num_envs
        for i in map(int, np.flatnonzero(live)):
            t = time.perf_counter()
            o, r, term, trunc, info = self.envs[i].step(_env_action(actions, i, self.action_space))
            out[i] = Transition(o, float(r), bool(term), bool(trunc), info, time.perf_counter() - t)
        return out

    def close(self) -> None:
        for e in self.envs:
            e.close()


def _row(infos: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Copy ``i``'s entries of a vector env's info dict (Gymnasium's ``key`` / ``_key`` mask layout)."""
    out: dict[str, Any] = {}
    for k, v in infos.items():
        if k.startswith("_") or k in ("final_obs", "final_info"):
            continue
        mask = infos.get(f"_{k}")
        if mask is None or bool(mask[i]):
            out[k] = _row(v, i) if isinstance(v, dict) else v[i]
    return out


def _index(obs: Obs, i: int) -> Obs:
    return {k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else obs[i]


class VectorSlots:
    """One SAME_STEP-autoreset vector env: every copy steps every step; a copy whose episode ended has already
    started the next one (its final observation and info come from ``final_obs`` / ``final_info``)."""

    steps_all = True

    def __init__(self, vec: gym.vector.VectorEnv[Any, Any, Any]) -> None:
        self.vec = vec
        self._next: list[Obs] = [None] * vec.num_envs

    @property
    def num_envs(self) -> int:
        return int(self.vec.num_envs)

    @property
    def action_space(self) -> gym.Space[Any]:
        return self.vec.single_action_space

    @property
    def observation_space(self) -> gym.Space[Any]:
        return self.vec.single_observation_space

    def reset_all(self, seed: int) -> list[Obs]:
        obs, _ = self.vec.reset(seed=seed)
        self._next = [None] * self.num_envs
        return [_index(obs, i) for i in range(self.num_envs)]

    def reset(self, slot: int, seed: int | None) -> Obs:
        if seed is None and self._next[slot] is not None:  # the autoreset's episode, with the copy's own RNG
            obs, self._next[slot] = self._next[slot], None
            return obs
        if self.num_envs != 1:
            raise ValueError("a vector env of several copies resets one copy only by its autoreset (seed None)")
        batched, _ = self.vec.reset(seed=seed)
        self._next = [None]
        return _index(batched, 0)

    def step(self, actions: np.ndarray, live: np.ndarray) -> list[Transition | None]:
        t = time.perf_counter()
        obs, rew, term, trunc, infos = self.vec.step(actions)
        share = (time.perf_counter() - t) / max(1, int(np.count_nonzero(live)))
        final_obs, final_info = infos.get("final_obs"), infos.get("final_info") or {}
        out: list[Transition | None] = []
        for i in range(self.num_envs):
            done = bool(term[i] or trunc[i])
            nxt = _index(obs, i)
            if done:
                self._next[i] = nxt
            out.append(Transition(
                final_obs[i] if done and final_obs is not None else nxt, float(rew[i]), bool(term[i]),
                bool(trunc[i]), _row(final_info, i) if done else _row(infos, i), share, nxt if done else None))
        return out

    def close(self) -> None:
        self.vec.close()


# ---------------------------------------------------------------- which episodes
@dataclass(frozen=True)
class EpisodePlan:
    """Which episodes to play: build with :meth:`seeded` or :meth:`split`."""

    seeds: tuple[int, ...] = ()  # seeded: episode k resets with seeds[k]
    per_slot: tuple[int, ...] = ()  # split: copy i plays per_slot[i] episodes
    seed: int = 0  # split: the vector reset's seed (copy i: seed + i)

    @classmethod
    def seeded(cls, seeds: Sequence[int]) -> EpisodePlan:
        """Episode ``k`` resets with ``seeds[k]`` on the first free copy: its outcome depends on its seed only."""
        return cls(seeds=tuple(int(s) for s in seeds))

    @classmethod
    def split(cls, episodes: int, num_envs: int, seed: int) -> EpisodePlan:
        """``episodes`` spread evenly over ``num_envs`` copies after one reset with ``seed``: short episodes do
        not crowd out long ones."""
        return cls(per_slot=tuple((episodes + i) // num_envs for i in range(num_envs)), seed=int(seed))

    @property
    def episodes(self) -> int:
        return len(self.seeds) if self.seeds else sum(self.per_slot)


@dataclass
class Step:
    """One step of a copy's episode, as an observer sees it. ``truncated`` is the env's own; ``cut``: the loop's
    ``max_episode_steps`` ended the episode here (the result counts it as truncated)."""

    episode: int
    t: int  # 1 for the first step; t=0 is the reset
    action: Any  # as the env got it
    reward: float
    terminated: bool
    truncated: bool
    cut: bool
    obs: Obs  # after the step: the episode's final observation when it ended
    info: Info


@dataclass
class EpisodeResult:
    """One finished episode. ``truncated`` covers the env's truncation and the loop's ``max_episode_steps``
    (``cut``: the loop's); ``success`` is the env's ``info["success"]`` on the last step (None when it reports none)."""

    episode: int
    slot: int
    seed: int | None
    ret: float
    length: int
    terminated: bool
    truncated: bool
    success: bool | None
    time_s: float
    cut: bool = False
    info_counts: dict[str, float] = field(default_factory=dict)


class EpisodeObserver(Protocol):
    """Sees every reset and step of the episodes the plan counts (recording's frames, collect's transitions)."""

    def on_reset(self, slot: int, episode: int, seed: int | None, obs: Obs) -> None: ...

    def on_step(self, slot: int, step: Step) -> None: ...


def _count(value: Any) -> float:
    """An info value as a violation count: True/False -> 1/0, a number -> itself, else truthiness."""
    if isinstance(value, (bool, np.bool_)):
        return float(bool(value))
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    return float(bool(value))


@dataclass
class _Running:
    episode: int
    seed: int | None
    time_s: float
    counts: dict[str, float]
    ret: float = 0.0
    length: int = 0


# ---------------------------------------------------------------- the loop
class ForkedTorchGenerator:
    """A fork of torch's global CPU generator, swapped in around each use. Policies sample from the global
    generator; a stochastic evaluation that did too would change what training draws next, so a run would
    train differently depending on how often it is evaluated. The fork starts where the global stream stands
    (the same evaluation numbers as drawing from it) and the global stream never moves."""

    def __init__(self) -> None:
        self.state = torch.get_rng_state()

    @contextmanager
    def active(self) -> Iterator[None]:
        outer = torch.get_rng_state()
        torch.set_rng_state(self.state)
        try:
            yield
        finally:
            self.state = torch.get_rng_state()
            torch.set_rng_state(outer)


@torch.inference_mode()
def iter_episodes(actor: Actor, slots: EpisodeSlots, plan: EpisodePlan, *, deterministic: bool = True,
                  max_episode_steps: int = 100_000, info_keys: tuple[str, ...] = (),
                  explore: Callable[[np.ndarray], np.ndarray] | None = None,
                  observer: EpisodeObserver | None = None) -> Iterator[EpisodeResult]:
    """Play ``plan``'s episodes with ``actor`` on ``slots``, yielding each as it ends (in the order they end).

    Every step acts once for all copies (one forward pass); ``explore`` may replace the env actions (``polar
    collect``'s epsilon). An episode longer than ``max_episode_steps`` is cut and counted as truncated; under a
    ``split`` plan a cut restarts every copy (envs that never end on their own), dropping the other copies'
    unfinished episodes."""
    space, obs_space = slots.action_space, slots.observation_space
    n = slots.num_envs if plan.per_slot else min(slots.num_envs, len(plan.seeds))
    if n == 0 or plan.episodes == 0:
        return
    if plan.per_slot and len(plan.per_slot) != slots.num_envs:
        raise ValueError(f"a split plan for {len(plan.per_slot)} copies on {slots.num_envs} env copies")
    if not plan.per_slot and slots.steps_all and n != slots.num_envs:
        raise ValueError(f"{len(plan.seeds)} seeded episodes on a vector env of {slots.num_envs} copies")
    pending: deque[tuple[int, int | None]] = deque(enumerate(plan.seeds))
    left = list(plan.per_slot)  # split: episodes still to start on each copy
    started = 0
    running: list[_Running | None] = [None] * n
    obs: list[Obs] = [None] * n

    def begin(i: int, seed: int | None, o: Obs, reset_s: float) -> None:
        nonlocal started
        if plan.per_slot:
            if left[i] == 0:
                running[i] = None
                obs[i] = o
                return
            left[i] -= 1
            k = started
        else:
            k, seed = pending.popleft()
        started += 1
        running[i] = _Running(k, seed, reset_s, dict.fromkeys(info_keys, 0.0))
        obs[i] = o
        if observer is not None:
            observer.on_reset(i, k, seed, o)

    def reset_all(seed: int) -> None:
        t = time.perf_counter()
        first = slots.reset_all(seed)
        share = (time.perf_counter() - t) / n
        for i in range(n):
            begin(i, seed + i, first[i], share)

    if plan.per_slot:
        reset_all(plan.seed)
    else:
        for i in range(n):
            t = time.perf_counter()
            o = slots.reset(i, pending[0][1])
            begin(i, None, o, time.perf_counter() - t)
    agent = actor.agent
    state = actor.get_initial_state(n)
    initial = actor.get_initial_state(n)
    sampling = nullcontext if deterministic else ForkedTorchGenerator().active
    done_count = 0
    while any(r is not None for r in running):
        live = np.array([r is not None for r in running])
        t = time.perf_counter()
        with sampling():
            action, state, _ = actor.act(obs_to_tensor(stack_obs(obs, obs_space)), state, deterministic)
        acts = to_env_actions(agent, action, n, space)
        if explore is not None:
            acts = explore(acts)
        share = (time.perf_counter() - t) / int(live.sum())
        steps = slots.step(acts, live)
        starts: np.ndarray = np.zeros(n, dtype=bool)
        cut_any = False
        for i in range(n):
            tr, run = steps[i], running[i]
            if tr is None:
                continue
            ended = tr.terminated or tr.truncated
            if run is None:  # an idle copy of a vector env: its autoreset episodes are not counted
                starts[i] |= ended
                obs[i] = slots.reset(i, None) if ended else tr.obs
                continue
            run.time_s += tr.time_s + share
            run.ret += tr.reward
            run.length += 1
            for key in info_keys:
                if key in tr.info:
                    run.counts[key] += _count(tr.info[key])
            cut = not ended and run.length >= max_episode_steps
            if observer is not None:
                observer.on_step(i, Step(run.episode, run.length, _env_action(acts, i, space), tr.reward,
                                         tr.terminated, tr.truncated, cut, tr.obs, tr.info))
            if not (ended or cut):
                obs[i] = tr.obs
                continue
            succ = tr.info.get("success")
            done_count += 1
            yield EpisodeResult(run.episode, i, run.seed, run.ret, run.length, tr.terminated, tr.truncated or cut,
                                None if succ is None else bool(succ), run.time_s, cut, run.counts)
            cut_any |= cut
            running[i] = None
            if plan.per_slot and cut:
                continue  # restarted below, with every copy
            if not plan.per_slot and not pending:
                if ended and slots.steps_all:
                    obs[i] = slots.reset(i, None)  # the autoreset's episode, not counted
                continue
            starts[i] = True
            t = time.perf_counter()
            seed = None if plan.per_slot else pending[0][1]
            begin(i, seed, slots.reset(i, seed), time.perf_counter() - t)
        if plan.per_slot and cut_any:  # a copy that never ends on its own: restart all, drop partial episodes
            for i, r in enumerate(running):
                if r is not None:  # dropped: its copy plays it again
                    left[i] += 1
                    running[i] = None
            reset_all(plan.seed + done_count + 1)
            state = actor.get_initial_state(n)
        elif starts.any() and state is not None:
            state = actor.reset_state(state, initial, torch.from_numpy(starts))


def run_episodes(actor: Actor, slots: EpisodeSlots, plan: EpisodePlan, *, deterministic: bool = True,
                 max_episode_steps: int = 100_000, info_keys: tuple[str, ...] = (),
                 explore: Callable[[np.ndarray], np.ndarray] | None = None,
                 observer: EpisodeObserver | None = None) -> list[EpisodeResult]:
    """:func:`iter_episodes` to the end, in the order the episodes ended."""
    return list(iter_episodes(actor, slots, plan, deterministic=deterministic, max_episode_steps=max_episode_steps,
                              info_keys=info_keys, explore=explore, observer=observer))


# ---------------------------------------------------------------- polar collect
class _Transitions:
    """The observer ``polar collect`` keeps an episode's observations, actions, rewards and flags with."""

    def __init__(self, space: gym.Space[Any]) -> None:
        self.space = space
        self.observations: list[np.ndarray] = []
        self.actions: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.terms: list[bool] = []
        self.truncs: list[bool] = []

    def on_reset(self, slot: int, episode: int, seed: int | None, obs: Obs) -> None:
        self.observations, self.actions, self.rewards, self.terms, self.truncs = [obs], [], [], [], []

    def on_step(self, slot: int, step: Step) -> None:
        self.actions.append(np.asarray(step.action, dtype=self.space.dtype))
        self.rewards.append(step.reward)
        self.terms.append(step.terminated)
        self.truncs.append(step.truncated or step.cut)
        self.observations.append(step.obs)


def collect_episodes(policy: ActingPolicy, harness_cfg: EnvHarnessConfig, episodes: int, seed: int = 0,
                     deterministic: bool = True, epsilon: float = 0.0, config_dir: Path | None = None,
                     max_episode_steps: int = 100_000) -> Iterator[Episode]:
    """``episodes`` whole episodes of ``policy`` for ``polar collect`` (one env copy); with ``epsilon`` > 0 each
    action is uniformly random with that probability (a "medium"/"mixed" dataset from a good policy). Episode
    ``i`` resets with seed ``seed + i``."""
    from polar.datasets.minari import Episode
    from polar.harness import make_vector_env

    slots = VectorSlots(make_vector_env(harness_cfg, 1, seed=seed, config_dir=config_dir))
    rng = np.random.default_rng(seed)
    space = slots.action_space
    space.seed(seed)

    def explore(acts: np.ndarray) -> np.ndarray:
        return np.asarray([space.sample()]) if epsilon > 0 and rng.random() < epsilon else acts

    keep = _Transitions(space)
    try:
        for r in iter_episodes(PolicyActor(policy), slots, EpisodePlan.seeded(range(seed, seed + episodes)),
                               deterministic=deterministic, max_episode_steps=max_episode_steps, explore=explore,
                               observer=keep):
            yield Episode(np.stack(keep.observations), np.stack(keep.actions), np.asarray(keep.rewards),
                          np.asarray(keep.terms), np.asarray(keep.truncs), seed=r.seed)
    finally:
        slots.close()
