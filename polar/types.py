"""Plain typed records shared across layers: the same schema in memory, on disk and on the wire.

``Fragment`` is what an env rollout worker sends the learner; ``CallRecord`` and ``TrajectorySample``
cross the gateway/trainer boundary; ``SessionResult`` is what one agent session turned into (the session collector's
groups, GRPO's input). Every layer may import them, so they live at the bottom.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

SESSION_KEY_PREFIX = "polar-session-"


def session_key(session_id: str) -> str:
    """An API key that names session ``session_id`` openly: it is a session name, not a credential.

    Polar's rollouts hand these to harnesses, so a CLI that drops the ``/s/{id}`` URL prefix still
    routes its calls to its own session, and the records keep the session's given name. The gateway
    reads it back (``polar.gateway.sessions.key_session_id``); it lives here because harnesses, which sit
    below the gateway, write it."""
    return SESSION_KEY_PREFIX + session_id


SESSION_SECRET_PREFIX = "polar-sk-"
SESSION_SECRET_CHARS = 32  # secrets.token_urlsafe(24): 192 random bits


def new_session_key(session_id: str) -> str:
    """A fresh secret API key for session ``session_id``: ``polar-sk-<32 random chars>.<session id>``.

    It names its session as :func:`session_key` does (a CLI that drops the ``/s/{id}`` prefix still
    routes), and its random part makes it a credential: the gateway gives a session to the key of its
    first call, so a sibling session, which can guess the id but not the key, can neither read nor
    append to it. Polar's rollouts hand one to each session attempt; it lives in memory only (the
    gateway's records hold its hash)."""
    return f"{SESSION_SECRET_PREFIX}{secrets.token_urlsafe(24)}.{session_id}"


def secret_key_session_id(key: str) -> str | None:
    """The session a :func:`new_session_key` key names, or ``None`` when ``key`` is not one."""
    head = len(SESSION_SECRET_PREFIX) + SESSION_SECRET_CHARS
    if key.startswith(SESSION_SECRET_PREFIX) and len(key) > head + 1 and key[head] == ".":
        return key[head + 1:]
    return None


@dataclass
class CallRecord:
    """One model call made by an agent harness through the gateway, exactly as the engine saw it.

    ``prompt_ids`` are the ids the engine consumed; ``sampled_ids``/``logprobs`` are what it produced.
    ``complete`` is False when token data is missing (an upstream that did not return ids, an error,
    a cancelled stream); such calls are never trained on. ``policy_version`` is the version of the weights
    that sampled its (first) tokens; a call that went on across a weight update (partial rollouts) has
    ``sampled_versions``, one per sampled id (empty: every token is ``policy_version``'s).
    """

    session_id: str
    call_index: int
    provider: str  # openai_chat | openai_responses | anthropic | gemini
    model: str  # the name the client asked for
    messages: list[dict[str, Any]]  # normalized (OpenAI-chat-like) messages incl. tools
    prompt_ids: list[int]
    sampled_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    started_at: float
    ended_at: float
    error: str | None = None
    complete: bool = True
    tools: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    sampled_versions: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CallRecord:
        return cls(**d)

    def token_versions(self) -> list[int]:
        """The policy version of each sampled id."""
        return list(self.sampled_versions) if self.sampled_versions else [self.policy_version] * len(self.sampled_ids)


@dataclass
class TrajectorySample:
    """One training sequence built from a session's calls.

    ``loss_mask[i] == 1`` only where ``token_ids[i]`` was sampled by the policy; prompt, tool-result and
    template tokens are 0. ``logprobs[i]`` is the behaviour policy's logprob where the mask is 1, else 0.
    """

    session_id: str
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    call_indices: list[int]
    reward: float | None = None
    group_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Fragment:
    """What a rollout worker sends the learner.

    - ``obs[t]`` is what the policy saw at step t (already normalized when ``normalize_obs`` is on);
      ``episode_starts[t]`` marks the first step of an episode.
    - ``rewards[t]`` are raw env rewards; ``terminated``/``truncated`` end the episode at step t (SAME_STEP).
    - ``trunc_values[t]`` is V(final_obs) of an episode truncated at step t (0 elsewhere): the learner
      adds ``gamma * trunc_values`` to the reward so truncation bootstraps instead of looking terminal.
    - ``last_values`` is V(obs after the last step), for GAE/V-trace bootstrapping.
    - ``initial_state``: the agent's internal state at step 0 (recurrent agents), as numpy, batch first.
    - ``next_obs[t]`` (off-policy runs only, else None): the observation after step t, and where an
      episode ended at step t its *final* observation, not the reset one, so a truncated step can be
      bootstrapped from the state it really reached.
    """

    obs: Any
    actions: np.ndarray
    log_probs: np.ndarray
    values: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_starts: np.ndarray
    trunc_values: np.ndarray
    last_values: np.ndarray
    initial_state: Any = None
    policy_version: int = 0
    worker_id: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_successes: list[float] = field(default_factory=list)  # only for episodes whose env reported info["success"]
    connector_process_restarts: int = 0  # connector processes restarted while collecting this fragment
    connector_copies_restarted: int = 0  # episodes cut by those restarts (one per copy the process hosted)
    obs_moments: Any = None  # raw-obs (mean, var, count) per key, when normalize_obs is on
    return_moments: tuple[Any, ...] | None = None  # discounted-return (mean, var, count), when normalize_reward is on
    next_obs: Any = None
    # follows the fragment across processes (worker logs, learner logs, traces): "w<worker>-<n>-<random hex>"
    trace_id: str | None = None
    collect_s: float = 0.0  # wall-clock seconds the worker spent collecting it (finds one slow connector copy)
    # [T, N] env steps each step lasted, when a step is an option (a hierarchical manager's decision): GAE
    # discounts it by gamma ** duration (SMDP); None: every step is one env step
    durations: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    @property
    def env_steps(self) -> int:
        return self.num_steps * self.num_envs


@dataclass(frozen=True)
class Rollout:
    """What an env learner (PPO, APPO) trains on: fragments, and the reward scaling the collector's return
    normalizer gives (``normalize_reward``; scale 1 and no clip without it)."""

    fragments: list[Fragment]
    reward_scale: float = 1.0
    reward_clip: float | None = None
    # the fragments as one ``polar.buffers.RolloutBuffer`` (PPO's epochs run on it), made by the collector when
    # the learner wants one: buffers sit beside algorithms, so neither names the other's type here
    buffer: Any = None


class ReplaySampler(Protocol):
    """Where off-policy gradient steps draw their minibatches (a replay buffer, or a mix of an old and a new one)."""

    def __len__(self) -> int: ...

    def sample(self, batch_size: int, beta: float | None = None) -> Any: ...


@dataclass(frozen=True)
class Replay:
    """What an off-policy learner (DQN, SAC) trains on: the buffer the collector has just filled (gradient steps
    sample from it; a prioritized one is updated by them) and the transitions the batch added."""

    sampler: ReplaySampler
    added: int


T_co = TypeVar("T_co", covariant=True)
T_contra = TypeVar("T_contra", contravariant=True)

Metrics = dict[str, Any]
"""A metrics row's fields (numbers, mostly; an evaluation result may nest)."""


@dataclass(frozen=True)
class Batch(Generic[T_co]):
    """One collect of a :class:`Collector`: what the learner trains on (``data``), and what the loop counts.

    - ``data``: the learner's input, typed by the pair: ``Rollout`` (PPO, APPO), ``Replay`` (DQN, SAC),
      ``list[OfflineBatch]`` (BC, IQL, CQL), ``dict[str, Fragment]`` (PettingZoo), groups of agent sessions
      (GRPO), demonstration batches (SFT).
    - ``env_steps``: env steps it holds (agent runs: sessions, one episode each); the episode lists hold the
      episodes that finished in it; ``policy_versions`` the versions that acted (``policy_lag``).
    - ``run_env_steps``, ``iteration``, ``version``: the loop's counters as the learner sees them, stamped by
      the loop before ``update`` (env steps including this batch; the iteration it belongs to, from 1; the
      policy version that the update starts from). Schedules and staleness read them here."""

    data: T_co
    env_steps: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_successes: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    run_env_steps: int = 0
    iteration: int = 0
    version: int = 0


@runtime_checkable
class Collector(Protocol[T_co]):
    """Where batches come from. ``collect`` blocks until the next batch is there and raises a ``PolarError``
    (never hangs) when its source fails; ``publish`` hands new weights to whatever acts (workers, engine).
    ``state_dict`` is its share of a checkpoint (a replay buffer is collector state; a :class:`SideFile` in it
    is written beside the checkpoint file); ``load_state_dict`` restores it before ``start``."""

    def start(self, weights: Mapping[str, Any], version: int) -> None: ...

    def collect(self) -> Batch[T_co]: ...

    def publish(self, weights: Mapping[str, Any], version: int) -> None: ...

    def metrics(self) -> Metrics: ...

    def close(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class Learner(Protocol[T_contra]):
    """What an algorithm does with a batch. ``update`` returns its stats (loss terms named ``*_loss`` are
    checked for NaN/inf); ``update_skipped: 1`` in them means no weight changed, so nothing is published.
    ``weights`` are what the collector acts with next; ``state_dict`` is the learner's share of a checkpoint
    (weights, optimizer, normalizers), merged at the checkpoint's top level."""

    def update(self, batch: Batch[T_contra], /) -> Metrics: ...

    def weights(self) -> Mapping[str, Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class Progress:
    """The loop's counters after an iteration, as an evaluator sees them."""

    iteration: int
    env_steps: int
    version: int


@runtime_checkable
class Evaluator(Protocol):
    """Evaluates the current weights for the loop. ``before`` runs once before the collector starts (after a
    warm-up stage; also on resume); ``periodic`` after every iteration, deciding itself whether one is due
    (``{}`` when not): what it returns joins that iteration's metrics row. ``final`` ends the run (after the last
    checkpoint). What ``before`` and ``final`` return joins the run's summary (``{"eval": {...}}``, ...). Each
    writes its own ``eval/<tag>.json`` files."""

    def before(self, progress: Progress) -> dict[str, Any]: ...

    def periodic(self, progress: Progress) -> Metrics: ...

    def final(self, progress: Progress) -> dict[str, Any]: ...


class NoEvaluation:
    """The evaluator of a run that evaluates nothing."""

    def before(self, progress: Progress) -> dict[str, Any]:
        return {}

    def periodic(self, progress: Progress) -> Metrics:
        return {}

    def final(self, progress: Progress) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class SideFile:
    """Collector or learner state too large for the checkpoint file (a replay buffer): the checkpoint manager
    writes it beside ``ckpt_<iteration>.pt`` as ``<prefix>_<iteration>.<suffix>`` with ``write(path)``, stores the
    file's name in its place, and removes it when that checkpoint is pruned."""

    prefix: str
    suffix: str
    write: Callable[[Path], None]


# ---------------------------------------------------------------- agent sessions (plain records, as Fragment)


class SessionStatus(str, enum.Enum):
    PENDING = "pending"
    INIT = "init"
    RUN = "run"
    POST_RUN = "post_run"
    DONE = "done"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (SessionStatus.DONE, SessionStatus.ERROR, SessionStatus.TIMEOUT, SessionStatus.CANCELLED)


@dataclass
class SessionResult:
    """The outcome of a session. ``samples`` carry the reward; a sample is trainable only if its mask has 1s.

    - DONE: verified; samples trainable unless a call lacked token data (then fully masked).
    - TIMEOUT: reward 0; trainable when every call's token data is complete, fully masked otherwise.
    - ERROR / CANCELLED: no training signal (masks zeroed, reward None); ``error`` says why.

    ``node_id`` is the gateway node that finally served the session. When a node died under it, the
    session was re-dispatched from INIT on another node: ``attempts`` counts the starts and
    ``lost_nodes`` lists ``{node_id, reason}`` for each node it lost.
    """

    session_id: str
    task_id: str
    group_id: str | None
    sample_index: int
    status: SessionStatus
    error: str | None = None
    reward: float | None = None
    verifier_output: dict[str, Any] = field(default_factory=dict)
    output: str = ""
    num_calls: int = 0
    node_id: str | None = None
    attempts: int = 1
    lost_nodes: list[dict[str, str]] = field(default_factory=list)
    samples: list[TrajectorySample] = field(default_factory=list)
    builder_stats: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def redispatched(self) -> int:
        """How many times the session was restarted on another node because its node was lost."""
        return self.attempts - 1

    @property
    def trainable(self) -> bool:
        return any(any(s.loss_mask) for s in self.samples)

    def to_dict(self, with_samples: bool = True) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        if not with_samples:
            d.pop("samples")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionResult:
        d = dict(d)
        d["status"] = SessionStatus(d["status"])
        d["samples"] = [TrajectorySample(**s) for s in d.get("samples", [])]
        return cls(**d)


#: Names of environment variables that hold credentials polar itself uses (an ``openai_compat`` engine's or
#: judge's ``api_key_env``, added when it is built): never passed on to the processes a harness starts.
CREDENTIAL_ENV: set[str] = set()
