"""The Collector of PettingZoo runs (``harness: {type: pettingzoo}``), beside the env collector.

It steps ``num_envs`` env copies in this process (``polar.harness.pettingzoo_env.EnvSlot``, AEC or Parallel)
and, each tick, asks every policy once for the actions of all the agents it plays in all copies: agents that
share a policy are one batched forward. Each (env copy, agent) of a learning policy is one decision stream: the
agent's own decisions in order. A decision's reward is everything the agent received until it acted again (AEC:
``last()``'s cumulative reward), and its episode ends at the agent's terminal or truncated outcome (truncation
bootstraps from V of the agent's final observation). A batch is one ``Fragment`` per policy, ``[T, columns]``
(columns: env copies x the policy's agents), built as soon as the policy's streams together hold ``T x columns``
decisions, by packing the streams end to end: a stream whose episode goes on is cut at its last decision, which
bootstraps from the value of the stream's next one. So a seat that sat out some games (self-play against the
pool) never holds a batch up, and every decision is trained on by the weights that took it, but for the fewer
than one tick's worth left over for the next batch.

Seats: by default each agent plays its mapped policy (``harness.policy_mapping``). With ``self_play`` each
game seats the learner at one random agent and gives the others one opponent drawn from the pool
(``polar.rollout.self_play``); their decisions are not trained on, and each of a pool opponent's moves is a
random legal one with probability ``self_play.opponent_noise``. ``play_games`` plays evaluation games with
given seats (the current policies, a pool snapshot, or a uniformly random legal player) and scores them.

In a game against the pool or a random player the learner's seat is drawn uniformly, or with
``self_play.seat_sampling: win_rate`` by its recent results at each seat (``seat_weights``): in an asymmetric game
the seat the learner does worse at (TicTacToe's ``player_2``) is played more often.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from polar.config.multi_agent import SHARED_POLICY, PettingZooHarnessConfig
from polar.distributions import ACTION_MASK_KEY
from polar.errors import AgentError, ConfigError
from polar.harness.pettingzoo_env import EnvSlot, Outcome, agent_spaces, make_pettingzoo_env
from polar.rollout.episodes import ForkedTorchGenerator
from polar.rollout.runner import obs_to_tensor
from polar.rollout.self_play import OpponentPool, Result, Snapshot
from polar.types import Batch, Fragment

Column = tuple[int, str]  # (env copy, agent id)
SEAT_DECAY = 0.99  # self_play.seat_sampling: win_rate counts results over about the last 1 / (1 - 0.99) = 100 games


def env_name(cfg: PettingZooHarnessConfig) -> str:
    if cfg.connector_spec is not None:
        spec = cfg.connector_spec
        return f"multi-agent connector {spec.class_name or ' '.join(spec.command or [])}"
    return f"pettingzoo env {cfg.id}"


def resolve_mapping(cfg: PettingZooHarnessConfig, agents: list[str]) -> dict[str, str]:
    """agent id -> policy name for every agent; an agent without a policy (or a name that is no agent) is an error."""
    if not cfg.policy_mapping:
        return dict.fromkeys(agents, SHARED_POLICY)
    unknown = [a for a in cfg.policy_mapping if a not in agents]
    if unknown:
        raise ConfigError(f"harness.policy_mapping names agent {unknown[0]!r}, which {env_name(cfg)} does not have "
                          f"(its agents: {', '.join(agents)})")
    missing = [a for a in agents if a not in cfg.policy_mapping]
    if missing:
        raise ConfigError(f"harness.policy_mapping: agent {missing[0]!r} of {env_name(cfg)} has no policy; map it "
                          f"(policy_mapping: {{{missing[0]}: <policy name>}}) or leave policy_mapping empty to share one")
    return dict(cfg.policy_mapping)


def policy_spaces(cfg: PettingZooHarnessConfig, mapping: dict[str, str],
                  spaces: dict[str, tuple[gym.Space, gym.Space]]) -> dict[str, tuple[gym.Space, gym.Space]]:
    """policy name -> (observation space, action space); agents sharing a policy must have the same spaces."""
    out: dict[str, tuple[gym.Space, gym.Space]] = {}
    first: dict[str, str] = {}
    for agent, name in mapping.items():
        if name not in out:
            out[name], first[name] = spaces[agent], agent
            continue
        for i, kind in enumerate(("observation", "action")):
            if spaces[agent][i] != out[name][i]:
                raise ConfigError(
                    f"harness.policy_mapping: agents {first[name]!r} and {agent!r} share policy {name!r} but their "
                    f"{kind} spaces differ ({out[name][i]} vs {spaces[agent][i]}); map them to different policies")
    return out


def stack_obs(items: list[Any], space: gym.Space) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: np.stack([np.asarray(o[k]) for o in items]) for k in space.spaces}
    return np.stack([np.asarray(o) for o in items])


@torch.inference_mode()
def act_batch(policy: Any, obs: list[Any], space: gym.Space, deterministic: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(actions, log-probs, values) of ``policy`` for a list of one agent's-kind observations, in one forward."""
    action, _, info = policy.act(obs_to_tensor(stack_obs(obs, space)), None, deterministic)
    n = len(obs)
    values = info.get("values", info.get("value")) if isinstance(info, dict) else None
    log_prob = info.get("log_prob") if isinstance(info, dict) else None
    if values is None or log_prob is None:
        raise AgentError(f"{type(policy.agent).__name__}.act() must return extra_info with 'log_prob' and 'values' "
                         "for multi-agent PPO")
    return (np.asarray(action).reshape(n), np.asarray(log_prob, np.float32).reshape(n),
            np.asarray(values, np.float32).reshape(n))


def random_action(obs: Any, space: gym.Space, rng: np.random.Generator) -> int:
    """A uniformly random legal action (the observation's ``action_mask`` when it has one)."""
    if isinstance(obs, dict) and ACTION_MASK_KEY in obs:
        return int(rng.choice(np.flatnonzero(np.asarray(obs[ACTION_MASK_KEY]))))
    return int(rng.integers(int(space.n))) if isinstance(space, gym.spaces.Discrete) else space.sample()


def game_result(returns: dict[str, float], agent: str) -> Result:
    """``agent``'s result: a win when its return is above every other agent's, a draw when tied with the best."""
    best_other = max((r for a, r in returns.items() if a != agent), default=returns[agent])
    if returns[agent] > best_other:
        return "win"
    return "draw" if returns[agent] == best_other else "loss"


@dataclass
class _Decision:
    obs: Any
    action: Any
    log_prob: float
    value: float
    start: bool
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    trunc_value: float = 0.0

    @property
    def ended(self) -> bool:
        return self.terminated or self.truncated


@dataclass
class Seat:
    """Who plays an agent this episode: a learning policy, a frozen pool snapshot, or a random legal player."""

    kind: Literal["learn", "pool", "random"]
    name: str = ""
    snapshot: Snapshot | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.name if self.snapshot is None else str(self.snapshot.snapshot_id))


class MultiAgentCollector:
    """``collect() -> Batch`` whose ``data`` is ``{policy name: Fragment}`` (see the module docstring)."""

    def __init__(self, cfg: PettingZooHarnessConfig, policies: dict[str, Any], mapping: dict[str, str],
                 fragment_steps: int, num_envs: int, seed: int, pool: OpponentPool | None = None,
                 config_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.name = env_name(cfg)
        self.policies = policies
        self.mapping = mapping
        self.fragment_steps = fragment_steps
        self.pool = pool
        self.rng = np.random.default_rng(seed)
        self.slots: list[EnvSlot] = []
        try:
            for i in range(num_envs):
                self.slots.append(EnvSlot(make_pettingzoo_env(cfg, config_dir, seed + 7919 * i, i), self.name,
                                          seed + 7919 * i))
        except BaseException:
            self.close()
            raise
        self.agents = list(self.slots[0].env.possible_agents)
        spaces = agent_spaces(self.slots[0].env)
        self.spaces = policy_spaces(cfg, mapping, spaces)
        self.agent_spaces = spaces
        self.columns: dict[str, list[Column]] = {
            name: [(s, a) for s in range(num_envs) for a in self.agents if mapping[a] == name] for name in policies}
        self.done: dict[Column, list[_Decision]] = {c: [] for cols in self.columns.values() for c in cols}
        self.pending: dict[Column, _Decision | None] = dict.fromkeys(self.done)
        self.seats: list[dict[str, Seat]] = [{} for _ in self.slots]
        self.acted: list[set[str]] = [set() for _ in self.slots]
        self.returns: list[dict[str, float]] = [{} for _ in self.slots]
        self.env_steps = 0
        self.version = 0
        self._episode_returns: list[float] = []
        self._episode_lengths: list[int] = []
        self._results: dict[str, int] = {"win": 0, "draw": 0, "loss": 0}
        self.games_vs_random = 0  # training games a random legal player sat in (self_play.random_share)
        self.opponent_random_moves = 0  # pool opponents' moves replaced by random ones (self_play.opponent_noise)
        # the learner's decayed win/draw/loss counts per seat, in games against the pool or a random player
        self.seat_results: dict[str, dict[Result, float]] = {a: {"win": 0.0, "draw": 0.0, "loss": 0.0}
                                                             for a in self.agents}
        self.learner_seat_games: dict[str, int] = dict.fromkeys(self.agents, 0)

    # ------------------------------------------------------------------ the Collector protocol
    def start(self, weights: Any, version: int) -> None:
        self.version = version  # the policies are the learner's own objects: nothing to copy

    def publish(self, weights: Any, version: int) -> None:
        self.version = version

    def collect(self) -> Batch:
        steps0 = self.env_steps
        T = self.fragment_steps
        while any(sum(len(self.done[c]) for c in cols) < T * len(cols) for cols in self.columns.values()):
            self._tick()
        data = {name: self._fragment(cols, T) for name, cols in self.columns.items()}
        returns, lengths = self._episode_returns, self._episode_lengths
        self._episode_returns, self._episode_lengths = [], []
        return Batch(data=data, env_steps=self.env_steps - steps0, episode_returns=returns, episode_lengths=lengths,
                     policy_versions=[self.version])

    def metrics(self) -> dict[str, float]:
        games = sum(self._results.values())
        out = {"self_play/train_games": float(games), "self_play/train_games_vs_random": float(self.games_vs_random)}
        out["self_play/opponent_random_moves"] = float(self.opponent_random_moves)
        self.games_vs_random = self.opponent_random_moves = 0
        if self.cfg.self_play is not None:
            for a, w in zip(self.agents, self.seat_weights(), strict=True):
                out[f"self_play/learner_games/{a}"] = float(self.learner_seat_games[a])
                out[f"self_play/seat_weight/{a}"] = float(w)
            self.learner_seat_games = dict.fromkeys(self.agents, 0)
        if self.pool is not None:
            out.update(self.pool.metrics())
        self._results = {"win": 0, "draw": 0, "loss": 0}
        return out

    def close(self) -> None:
        for slot in self.slots:
            slot.close()

    def state_dict(self) -> dict[str, Any]:
        # the opponent pool is the learner's (its snapshots are of the learner's weights); the seat counts are here
        return {"self_play_seat_results": self.seat_results} if self.cfg.self_play is not None else {}

    def load_state_dict(self, state: Any) -> None:
        saved = state.get("self_play_seat_results")
        if saved is not None:
            self.seat_results = {a: {k: float(v) for k, v in saved[a].items()} for a in self.agents}

    def seat_weights(self) -> np.ndarray:
        """The chance of each agent (in ``self.agents``' order) being the learner's seat in a game against the pool
        or a random player: uniform, or (``seat_sampling: win_rate``) in proportion to the learner's smoothed
        shortfall there, ``(losses + draws/2 + 1) / (games + 2)`` over about its last 100 games at that seat."""
        sp = self.cfg.self_play
        if sp is None or sp.seat_sampling == "uniform":
            w = np.ones(len(self.agents))
        else:
            w = np.array([(r["loss"] + 0.5 * r["draw"] + 1.0) / (sum(r.values()) + 2.0)
                          for r in (self.seat_results[a] for a in self.agents)])
        return w / w.sum()

    # ------------------------------------------------------------------ stepping
    def _seat(self, s: int) -> None:
        """Seats for env copy ``s``'s next episode."""
        sp = self.cfg.self_play
        if sp is not None and sp.random_share > 0 and self.rng.random() < sp.random_share:
            other = Seat("random")
        else:
            snap = self.pool.sample() if self.pool is not None else None
            if snap is None:
                self.seats[s] = {a: Seat("learn", self.mapping[a]) for a in self.agents}
                return
            other = Seat("pool", snapshot=snap)
        if sp is not None and sp.seat_sampling == "win_rate":
            learner = self.agents[int(self.rng.choice(len(self.agents), p=self.seat_weights()))]
        else:
            learner = self.agents[int(self.rng.integers(len(self.agents)))]
        self.learner_seat_games[learner] += 1
        self.seats[s] = {a: Seat("learn", self.mapping[a]) if a == learner else other for a in self.agents}
        self.games_vs_random += other.kind == "random"

    def _end_episode(self, s: int) -> None:
        for agent in self.agents:  # an agent that left without a final outcome: its last decision is cut here
            col = (s, agent)
            step = self.pending.get(col)
            if step is not None:
                step.truncated, step.trunc_value = True, step.value
                self.done[col].append(step)
                self.pending[col] = None
        returns = self.returns[s]
        learners = [a for a, seat in self.seats[s].items() if seat.kind == "learn" and a in returns]
        for a in learners:
            self._episode_returns.append(returns[a])
            self._episode_lengths.append(self.slots[s].step_count)
        opponents = [seat.snapshot for seat in self.seats[s].values() if seat.snapshot is not None]
        if opponents and learners and self.pool is not None:
            result = game_result(returns, learners[0])
            self._results[result] += 1
            self.pool.record(opponents[0].snapshot_id, result)
        if sum(seat.kind == "learn" for seat in self.seats[s].values()) == 1 and learners:  # the learner at one seat
            counts = self.seat_results[learners[0]]
            for k in counts:
                counts[k] *= SEAT_DECAY
            counts[game_result(returns, learners[0])] += 1.0

    def _outcome(self, s: int, o: Outcome, trunc: list[tuple[str, _Decision, Any]]) -> None:
        self.returns[s][o.agent] = self.returns[s].get(o.agent, 0.0) + o.reward
        col = (s, o.agent)
        step = self.pending.get(col)
        if step is None:
            return
        step.reward += o.reward
        step.terminated, step.truncated = o.terminated, o.truncated and not o.terminated
        if step.truncated and o.obs is None:  # no final observation: bootstrap from the decision's own value
            step.trunc_value = step.value
        elif step.truncated:
            trunc.append((self.mapping[o.agent], step, o.obs))
        self.done[col].append(step)
        self.pending[col] = None

    def _poll(self, s: int, trunc: list[tuple[str, _Decision, Any]]) -> list[tuple[str, Any]]:
        slot = self.slots[s]
        for _ in range(2):
            if slot.episode_over:
                if slot.episode > 0:
                    self._end_episode(s)
                slot.reset()
                self._seat(s)
                self.acted[s] = set()
                self.returns[s] = {}
            outcomes, requests = slot.poll()
            for o in outcomes:
                self._outcome(s, o, trunc)
            if not slot.episode_over:
                return requests
        raise AgentError(f"{self.name}: an episode ended at its reset; the env has no agent to play")

    def _tick(self) -> None:
        """One action for every env copy's acting agents: one forward per policy (and per pool opponent)."""
        groups: dict[tuple[str, str], list[tuple[int, str, Any]]] = defaultdict(list)
        seats: dict[tuple[str, str], Seat] = {}
        trunc: list[tuple[str, _Decision, Any]] = []
        for s in range(len(self.slots)):
            for agent, obs in self._poll(s, trunc):
                seat = self.seats[s][agent]
                groups[seat.key].append((s, agent, obs))
                seats[seat.key] = seat
        by_policy: dict[str, list[tuple[_Decision, Any]]] = defaultdict(list)
        for name, step, obs in trunc:  # V(final observation) of truncated decisions, batched per policy
            by_policy[name].append((step, obs))
        for name, items in by_policy.items():
            _, _, values = act_batch(self.policies[name], [o for _, o in items], self.spaces[name][0], True)
            for (step, _), v in zip(items, values, strict=True):
                step.trunc_value = float(v)
        actions: dict[int, dict[str, Any]] = defaultdict(dict)
        for key, reqs in groups.items():
            seat = seats[key]
            obs = [r[2] for r in reqs]
            if seat.kind == "random":
                for s, agent, o in reqs:
                    actions[s][agent] = random_action(o, self.agent_spaces[agent][1], self.rng)
                continue
            policy = self.policies[seat.name] if seat.snapshot is None else seat.snapshot.policy
            space = self.spaces[self.mapping[reqs[0][1]]][0]
            acts, log_probs, values = act_batch(policy, obs, space, False)
            noise = self.cfg.self_play.opponent_noise if seat.kind == "pool" and self.cfg.self_play else 0.0
            for (s, agent, o), a, lp, v in zip(reqs, acts, log_probs, values, strict=True):
                if noise > 0 and self.rng.random() < noise:  # self_play.opponent_noise: a pool opponent's slip
                    a = random_action(o, self.agent_spaces[agent][1], self.rng)
                    self.opponent_random_moves += 1
                actions[s][agent] = a
                if seat.kind == "learn":
                    self.pending[(s, agent)] = _Decision(o, a, float(lp), float(v), start=agent not in self.acted[s])
                    self.acted[s].add(agent)
        for s, acts_s in actions.items():
            self.slots[s].act(acts_s)
            self.env_steps += 1

    def _fragment(self, cols: list[Column], T: int) -> Fragment:
        """``[T, len(cols)]`` from the policy's decision streams, oldest first, packed end to end (see the module
        docstring); a stream's last decision, when its episode goes on, is cut there: it bootstraps from the
        value of the stream's next decision (``truncated`` with ``trunc_value``), so streams can share a column."""
        t0 = time.perf_counter()
        C = len(cols)
        seq: list[tuple[Column, _Decision]] = []
        for c in cols:
            queue = self.done[c]
            for i, d in enumerate(queue):
                if i == len(queue) - 1 and not d.ended:
                    nxt = self.pending[c]
                    d = replace(d, truncated=True, trunc_value=nxt.value if nxt is not None else d.value)
                seq.append((c, d))
        used: dict[Column, int] = defaultdict(int)
        for c, _ in seq[:T * C]:
            used[c] += 1
        for c, k in used.items():
            del self.done[c][:k]  # what is left (less than one tick's decisions) starts the next batch
        rows = [[seq[j * T + t][1] for j in range(C)] for t in range(T)]
        last: np.ndarray = np.zeros(C, np.float32)
        for j in range(C):
            end = j * T + T - 1
            if not seq[end][1].ended:  # a column that ends inside a stream: V of the stream's next decision
                last[j] = seq[end + 1][1].value
        space = self.spaces[self.mapping[cols[0][1]]][0]
        per_t = [stack_obs([d.obs for d in row], space) for row in rows]
        obs = ({k: np.stack([o[k] for o in per_t]) for k in per_t[0]} if isinstance(per_t[0], dict) else np.stack(per_t))

        def field(get: Callable[[_Decision], Any], dtype: Any) -> np.ndarray:
            return np.array([[get(d) for d in row] for row in rows], dtype=dtype)

        return Fragment(obs=obs, actions=field(lambda d: d.action, np.int64),
                        log_probs=field(lambda d: d.log_prob, np.float32),
                        values=field(lambda d: d.value, np.float32), rewards=field(lambda d: d.reward, np.float32),
                        terminated=field(lambda d: d.terminated, np.float32),
                        truncated=field(lambda d: d.truncated, np.float32),
                        episode_starts=field(lambda d: d.start, np.float32),
                        trunc_values=field(lambda d: d.trunc_value, np.float32), last_values=last,
                        policy_version=self.version, collect_s=time.perf_counter() - t0)


@dataclass
class GameReport:
    """Per-agent returns and win/draw/loss of the games ``play_games`` played."""

    games: int
    returns: dict[str, list[float]]
    results: dict[str, dict[str, int]]  # seat label -> {"win": n, "draw": n, "loss": n}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"games": self.games,
                               "return_mean": {a: float(np.mean(r)) if r else None for a, r in self.returns.items()}}
        for label, res in self.results.items():
            n = max(1, sum(res.values()))
            out[label] = {"win_rate": res["win"] / n, "draw_rate": res["draw"] / n, "loss_rate": res["loss"] / n,
                          "win_or_draw_rate": (res["win"] + res["draw"]) / n, **res}
        return out


@torch.inference_mode()
def play_games(cfg: PettingZooHarnessConfig, seats: Callable[[int], dict[str, Seat]], policies: dict[str, Any],
               mapping: dict[str, str], games: int, seed: int, deterministic: bool = True,
               scored: Callable[[int], str | None] = lambda g: None, config_dir: Path | None = None) -> GameReport:
    """Play ``games`` games on one env copy; ``seats(g)`` seats game g; ``scored(g)`` names the agent whose
    win/draw/loss game g counts for (None: every agent's own). Every action is checked against its mask."""
    name = env_name(cfg)
    slot = EnvSlot(make_pettingzoo_env(cfg, config_dir, seed), name, seed)
    rng = np.random.default_rng(seed)
    spaces = agent_spaces(slot.env)
    returns: dict[str, list[float]] = defaultdict(list)
    results: dict[str, dict[str, int]] = defaultdict(lambda: {"win": 0, "draw": 0, "loss": 0})
    sampling = nullcontext if deterministic else ForkedTorchGenerator().active
    try:
        for g in range(games):
            slot.reset()
            seat = seats(g)
            ret: dict[str, float] = defaultdict(float)
            while True:
                outcomes, requests = slot.poll()
                for o in outcomes:
                    ret[o.agent] += o.reward
                if slot.episode_over:
                    break
                acts: dict[str, Any] = {}
                for agent, obs in requests:
                    st = seat[agent]
                    if st.kind == "random":
                        acts[agent] = random_action(obs, spaces[agent][1], rng)
                        continue
                    policy = policies[st.name] if st.snapshot is None else st.snapshot.policy
                    with sampling():
                        a, _, _ = act_batch(policy, [obs], spaces[agent][0], deterministic)
                    acts[agent] = a[0]
                slot.act(acts)
            subject = scored(g)
            for agent in slot.env.possible_agents:
                returns[agent].append(ret.get(agent, 0.0))
            full = {a: ret.get(a, 0.0) for a in slot.env.possible_agents}
            if subject is not None:
                results["learner"][game_result(full, subject)] += 1
            else:
                for agent in full:
                    results[agent][game_result(full, agent)] += 1
    finally:
        slot.close()
    return GameReport(games, dict(returns), dict(results))


@torch.inference_mode()
def record_policy_observations(cfg: PettingZooHarnessConfig, policies: dict[str, Any], mapping: dict[str, str],
                               samples: int, seed: int, config_dir: Path | None = None) -> dict[str, Any]:
    """Policy id -> ``samples`` observations (stacked, as the policy's observation space) its agents met in games
    where every agent samples from its own policy: what ``polar export`` checks each exported graph on."""
    slot = EnvSlot(make_pettingzoo_env(cfg, config_dir, seed), env_name(cfg), seed)
    spaces = agent_spaces(slot.env)
    seen: dict[str, list[Any]] = {pid: [] for pid in policies}
    try:
        for _ in range(samples):  # every game gives at least one observation
            if all(len(v) >= samples for v in seen.values()):
                break
            slot.reset()
            while True:
                _, requests = slot.poll()
                if slot.episode_over:
                    break
                acts: dict[str, Any] = {}
                for agent, obs in requests:
                    seen[mapping[agent]].append(obs)
                    a, _, _ = act_batch(policies[mapping[agent]], [obs], spaces[agent][0], False)
                    acts[agent] = a[0]
                slot.act(acts)
    finally:
        slot.close()
    out: dict[str, Any] = {}
    for pid, obs in seen.items():
        if not obs:
            raise ConfigError(f"{env_name(cfg)}: no agent of policy {pid!r} acted in {samples} games; nothing to "
                              "check its export on")
        agent = next(a for a, p in mapping.items() if p == pid)
        out[pid] = stack_obs(obs[:samples], spaces[agent][0])
    return out
