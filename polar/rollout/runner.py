"""``EnvRunner``: steps a SAME_STEP-autoreset vector env with a policy, one batched forward per step.

Used in the learner process (``rollout_workers: 0``) and inside every worker process. The hot loop
avoids per-step allocations where it can: one ``torch.from_numpy`` view per step and preallocated
fragment arrays. Actions come from the agent's ``act``; the built-in MLP actor-critic acts through
``act_numpy`` (its numpy twin, a fraction of torch's per-call cost) only on the fused path
(``policy.kwargs.fused: auto`` and ``act`` as pinned, ``polar.algorithms.ppo.fused_path``). On that path
each step runs only the actor, through one ``rollout_actor`` set up per fragment (its sampling noise drawn
at once, its weights copied once); the critic's values of a fragment come from one batched
``values_numpy`` call at its end (the weights do not move while a fragment is collected).
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from polar.agents import check_act_output, map_state, reset_state
from polar.algorithms.ppo import FusedSetting, fused_path
from polar.algorithms.ppo_fused import changed_methods, supports_fused
from polar.config.appo import APPOKwargs
from polar.config.ppo import PPOKwargs
from polar.config.run import EnvRunConfig
from polar.errors import AgentError
from polar.models.policy import Policy
from polar.types import Fragment

log = logging.getLogger(__name__)

NumpyAct = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray | None]]
"""``act_numpy(obs, deterministic=False[, with_values=True]) -> (actions, log_probs, values or None)``."""
RolloutActor = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]
"""``actor(obs, t) -> (actions, log_probs)`` at step ``t`` of one fragment (``ActorCriticAgent.rollout_actor``)."""


def runner_options(cfg: EnvRunConfig) -> dict[str, Any]:
    """``EnvRunner`` keyword arguments for a run config (what its algorithm needs from collection): PPO and
    APPO normalize observations and rewards while collecting when asked; DQN, SAC and runs with an intrinsic reward
    keep ``next_obs``;
    PPO's ``fused`` switch also decides whether the built-in MLP acts through numpy."""
    kw = cfg.policy.kwargs
    normalize_obs = normalize_reward = False
    if isinstance(kw, (PPOKwargs, APPOKwargs)):
        normalize_obs, normalize_reward = kw.normalize_obs, kw.normalize_reward
    return {"gamma": float(getattr(kw, "gamma", 0.99)), "normalize_obs": normalize_obs,
            "normalize_reward": normalize_reward, "keep_next_obs": bool(getattr(kw, "keeps_next_obs", False))
            or getattr(kw, "intrinsic", None) is not None,  # RND scores the observation each step reached
            "fused": kw.fused if isinstance(kw, PPOKwargs) else "auto"}


def obs_to_tensor(obs):
    if isinstance(obs, dict):
        return {k: torch.from_numpy(np.asarray(v)) for k, v in obs.items()}
    return torch.from_numpy(np.asarray(obs))


def _stack_obs(items: list, space: gym.Space):
    if isinstance(space, gym.spaces.Dict):
        return {k: np.stack([np.asarray(o[k]) for o in items]) for k in space.spaces}
    return np.stack([np.asarray(o) for o in items])


def _final_info_counts(ended: list[tuple[np.ndarray, dict[str, Any]]]) -> tuple[list[float], int]:
    """(success of each ended episode that reports one, connector copies restarted) from the ``final_info`` of
    the steps where episodes ended, in the order they ended."""
    successes: list[float] = []
    restarted = 0
    for idx, infos in ended:
        final_info = infos.get("final_info", {})
        if not isinstance(final_info, dict):
            continue
        succ, succ_mask = final_info.get("success"), final_info.get("_success")
        rst = final_info.get("polar/connector_restart")
        if succ is None and rst is None:
            continue
        for i in idx:
            if succ is not None and (succ_mask is None or succ_mask[i]):
                successes.append(float(bool(succ[i])))
            if rst is not None and bool(rst[i]):
                restarted += 1
    return successes, restarted


class EnvRunner:
    """Collects fragments of ``T`` steps from ``vec_env`` with ``policy`` (a ``polar.models.Policy``)."""

    def __init__(self, vec_env: gym.vector.VectorEnv, policy: Policy, seed: int | None = None, gamma: float = 0.99,
                 normalize_obs: bool = False, normalize_reward: bool = False, keep_next_obs: bool = False,
                 fused: FusedSetting = "auto") -> None:
        self.env = vec_env
        self.policy = policy
        self.num_envs = vec_env.num_envs
        self.obs_space = vec_env.single_observation_space
        self.action_space = vec_env.single_action_space
        self.dist = policy.agent.action_dist
        self.clip_actions = isinstance(self.action_space, gym.spaces.Box)
        self.gamma = gamma
        self.normalize_obs = normalize_obs
        self.normalize_reward = normalize_reward
        self.keep_next_obs = keep_next_obs  # off-policy: record next_obs (final obs where episodes end)
        self.agent_name = type(policy.agent).__name__
        obs, _ = vec_env.reset(seed=seed)
        self.obs = obs
        self.starts = np.ones(self.num_envs, dtype=np.float32)
        self.state = policy.agent.get_initial_state(self.num_envs)
        self.initial = policy.agent.get_initial_state(self.num_envs)
        self.ep_ret = np.zeros(self.num_envs, dtype=np.float64)
        self.ep_len = np.zeros(self.num_envs, dtype=np.int64)
        self.disc_ret = np.zeros(self.num_envs, dtype=np.float64)
        self.env_steps = 0
        self._process_restarts_seen = 0  # connector process restarts already reported in a fragment
        act_numpy = self._numpy_act(fused)
        # an agent whose numpy critic can run once per fragment acts without it each step (act_numpy's with_values)
        values_numpy = getattr(self.policy.agent, "values_numpy", None)
        self.fast_values: Callable[[np.ndarray], np.ndarray] | None = (
            values_numpy if act_numpy is not None and values_numpy is not None else None)
        self.fast_act: NumpyAct | None = (functools.partial(act_numpy, with_values=False)
                                          if act_numpy is not None and self.fast_values is not None else act_numpy)
        # an agent with a per-fragment numpy actor (act_numpy without values, set up once per fragment) acts
        # through it on this path
        rollout_actor = getattr(self.policy.agent, "rollout_actor", None)
        self.rollout_actor: Callable[[int, int], RolloutActor] | None = (
            rollout_actor if act_numpy is not None and self.fast_values is not None else None)

    def _numpy_act(self, fused: FusedSetting) -> NumpyAct | None:
        """The agent's ``act_numpy`` when it may stand in for ``act``: a built-in feed-forward MLP on float32
        vector observations without an obs normalizer; for the actor-critic also only on the fused path (its
        ``act`` unchanged since ``act_numpy`` was derived from it), for an agent with ``act_numpy_derived_from``
        (DQN's) only while those methods are unchanged. Else None: every step calls ``act``."""
        agent, space = self.policy.agent, self.obs_space
        act_numpy = getattr(agent, "act_numpy", None)
        supports = getattr(agent, "supports_act_numpy", None)
        if (act_numpy is None or supports is None or self.policy.obs_norm is not None or self.state is not None
                or not isinstance(space, gym.spaces.Box) or space.dtype != np.float32 or len(space.shape) != 1
                or not supports()):
            return None
        if supports_fused(agent):
            on, why = fused_path(agent, fused)
            if not on:
                log.debug("acting through %s.act: %s", self.agent_name, why)
                return None
        derived_from = getattr(agent, "act_numpy_derived_from", None)
        if derived_from is not None and (changed := changed_methods(type(agent), derived_from)):
            log.info("acting through %s.act: %s changed since act_numpy was derived from it", self.agent_name,
                     ", ".join(changed))
            return None
        return act_numpy  # type: ignore[no-any-return]

    def _act(self, obs_np, state, deterministic=False):
        tobs = obs_to_tensor(obs_np)
        nobs = self.policy.normalize(tobs)
        action, new_state, info = self.policy.agent.act(nobs, state, deterministic)
        if not isinstance(info, dict):
            raise AgentError(f"{self.agent_name}.act() must return (action, new_internal_state, extra_info: dict)")
        return nobs, action, new_state, info

    def _values(self, info, n: int) -> np.ndarray:
        v = info.get("values", info.get("value"))
        if v is None:
            raise AgentError(f"{self.agent_name}.act() returned extra_info without 'values'; PPO needs a value head.")
        v = torch.as_tensor(v).reshape(-1)
        if v.shape[0] != n:
            raise AgentError(f"{self.agent_name}.act() returned values of shape {tuple(v.shape)}, expected ({n},)")
        return v.numpy()

    def _policy_step(self, t, T, N, obs, first, obs_buf, actions, log_probs, values):
        """One batched act() through the agent's own (torch) code, results written into the buffers."""
        nobs, action, new_state, info = self._act(obs, self.state)
        act_np = check_act_output(self.policy.agent, action, N, self.action_space)
        lp = info.get("log_prob")
        if lp is None:
            self.dist.check(info, self.agent_name)
            lp = self.dist.log_prob(info, torch.as_tensor(act_np))
        if first:
            first = False
            obs_buf = ({k: np.empty((T, *v.shape), v.numpy().dtype) for k, v in nobs.items()}
                       if isinstance(nobs, dict) else np.empty((T, *nobs.shape), nobs.numpy().dtype))
            actions = np.empty((T, *act_np.shape), act_np.dtype)
            log_probs = np.empty((T, N), np.float32)
        if isinstance(nobs, dict):
            for k, v in nobs.items():
                obs_buf[k][t] = v.numpy()
        else:
            obs_buf[t] = nobs.numpy()
        actions[t] = act_np
        log_probs[t] = lp.numpy() if isinstance(lp, torch.Tensor) else lp
        values[t] = self._values(info, N)
        return first, obs_buf, actions, log_probs, act_np, new_state

    @torch.inference_mode()
    def collect(self, num_steps: int, policy_version: int = 0, worker_id: int = 0) -> Fragment:
        T, N = num_steps, self.num_envs
        t_start = time.perf_counter()
        self._fragments = getattr(self, "_fragments", 0) + 1
        trace_id = f"w{worker_id}-{self._fragments}-{secrets.token_hex(4)}"
        first = True
        obs_buf: np.ndarray | dict[str, np.ndarray] | None = None
        actions: np.ndarray | None = None
        log_probs: np.ndarray | None = None
        values = np.empty((T, N), np.float32)
        rewards = np.empty((T, N), np.float32)
        terminated = np.empty((T, N), np.float32)
        truncated = np.empty((T, N), np.float32)
        starts = np.empty((T, N), np.float32)
        dones = np.empty((T, N), np.bool_)  # episode ends: starts[t + 1] = dones[t], filled in after the loop
        trunc_values = np.zeros((T, N), np.float32)
        initial_state = map_state(lambda s: s.numpy().copy(), self.state)
        ended: list[tuple[np.ndarray, dict[str, Any]]] = []  # (envs whose episode ended, infos) per such step
        ended_returns: list[np.ndarray] = []
        ended_lengths: list[np.ndarray] = []
        raw_obs_batches: list[np.ndarray | dict[str, np.ndarray]] | None = [] if self.normalize_obs else None
        disc_rets = np.empty((T, N), np.float64) if self.normalize_reward else None
        next_buf = None
        fast_act, env_step, ep_ret, ep_len = self.fast_act, self.env.step, self.ep_ret, self.ep_len
        actor = self.rollout_actor(T, N) if self.rollout_actor is not None and T else None
        for t in range(T):
            obs = self.obs
            if raw_obs_batches is not None:
                raw_obs_batches.append(obs)
            if actor is not None:  # built-in MLP: the fragment's numpy actor, values after the loop
                if obs_buf is None:
                    obs_buf = np.empty((T, *obs.shape), np.float32)
                assert isinstance(obs_buf, np.ndarray)
                obs_buf[t] = obs
                act_np, lp_np = actor(obs_buf[t], t)  # the float32 observations the learner gets
                if first:
                    first = False
                    actions = np.empty((T, *act_np.shape), act_np.dtype)
                    log_probs = np.empty((T, N), np.float32)
                assert actions is not None and log_probs is not None  # from t = 0
                actions[t] = act_np
                log_probs[t] = lp_np
                new_state = None
            elif fast_act is not None:  # numpy forward on the live weights
                act_np, lp_np, v_np = fast_act(obs)
                if first:
                    first = False
                    obs_buf = np.empty((T, *obs.shape), np.float32)
                    actions = np.empty((T, *act_np.shape), act_np.dtype)
                    log_probs = np.empty((T, N), np.float32)
                assert isinstance(obs_buf, np.ndarray) and actions is not None and log_probs is not None  # from t = 0
                obs_buf[t] = obs
                actions[t] = act_np
                log_probs[t] = lp_np
                if v_np is not None:
                    values[t] = v_np
                new_state = None
            else:
                first, obs_buf, actions, log_probs, act_np, new_state = self._policy_step(
                    t, T, N, obs, first, obs_buf, actions, log_probs, values)
            env_act = np.clip(act_np, self.action_space.low, self.action_space.high) if self.clip_actions else act_np
            next_obs, rew, term, trunc, infos = env_step(env_act)
            rewards[t] = rew
            terminated[t] = term
            truncated[t] = trunc
            ep_ret += rew
            ep_len += 1
            if disc_rets is not None:
                self.disc_ret = self.disc_ret * self.gamma + rew
                disc_rets[t] = self.disc_ret
            done = np.logical_or(term, trunc, out=dones[t])
            state = new_state
            if self.keep_next_obs:
                next_buf = self._record_next_obs(next_buf, t, T, next_obs, done, infos)
            if np.count_nonzero(done):  # episode ends: what the next step needs now, the statistics after the loop
                idx = done.nonzero()[0]
                ended.append((idx, infos))
                ended_returns.append(ep_ret[idx])
                ended_lengths.append(ep_len[idx])
                ep_ret[idx] = 0.0
                ep_len[idx] = 0
                if disc_rets is not None:
                    self.disc_ret[idx] = 0.0
                if np.count_nonzero(trunc):
                    tr_idx = np.flatnonzero(np.logical_and(trunc, np.logical_not(term)))
                    if tr_idx.size:
                        finals = _stack_obs([infos["final_obs"][i] for i in tr_idx], self.obs_space)
                        sel = torch.as_tensor(tr_idx)
                        sub_state = map_state(lambda s, i=sel: s[i], state)
                        _, _, _, finfo = self._act(finals, sub_state, deterministic=True)
                        trunc_values[t, tr_idx] = self._values(finfo, tr_idx.size)
                if state is not None:
                    state = reset_state(state, self.initial, torch.from_numpy(done))
            self.state = state
            self.obs = next_obs
        # Python floats and ints, as float() and int() give, in the order the episodes ended
        ep_returns: list[float] = np.concatenate(ended_returns).tolist() if ended_returns else []
        ep_lengths: list[int] = np.concatenate(ended_lengths).tolist() if ended_lengths else []
        ep_successes, copies_restarted = _final_info_counts(ended)
        if T:
            starts[0] = self.starts
            starts[1:] = dones[:-1]
            self.starts = dones[-1].astype(np.float32)
        if self.fast_values is not None and isinstance(obs_buf, np.ndarray):  # the whole fragment's values at once
            chunk = max(1, 512 // N)  # steps per call: [chunk, N, 64] temporaries stay in cache
            for t0 in range(0, T, chunk):  # [chunk, N, obs]: per step in C, bit for bit act_numpy's values
                values[t0:t0 + chunk] = self.fast_values(obs_buf[t0:t0 + chunk])
        _, _, _, last_info = self._act(self.obs, self.state, deterministic=True)
        last_values = self._values(last_info, N).copy()
        self.env_steps += T * N
        if actions is None or log_probs is None:
            raise ValueError(f"EnvRunner.collect needs at least one step, got num_steps={num_steps}")
        frag = Fragment(
            obs=obs_buf, actions=actions, log_probs=log_probs, values=values, rewards=rewards,
            terminated=terminated, truncated=truncated, episode_starts=starts, trunc_values=trunc_values,
            last_values=last_values, initial_state=initial_state, policy_version=policy_version, worker_id=worker_id,
            episode_returns=ep_returns, episode_lengths=ep_lengths, episode_successes=ep_successes,
            connector_copies_restarted=copies_restarted, connector_process_restarts=self._take_process_restarts(),
            next_obs=next_buf, trace_id=trace_id, collect_s=time.perf_counter() - t_start,
        )
        if raw_obs_batches is not None:
            frag.obs_moments = _obs_moments(raw_obs_batches)
        if disc_rets is not None:
            frag.return_moments = (float(disc_rets.mean()), float(disc_rets.var()), int(disc_rets.size))
        return frag

    def _take_process_restarts(self) -> int:
        """Connector process restarts since the last fragment (0 for envs that are not connectors)."""
        total = int(getattr(self.env, "restarts", 0) or 0)
        new, self._process_restarts_seen = total - self._process_restarts_seen, total
        return new

    def _record_next_obs(self, buf, t: int, T: int, next_obs, done: np.ndarray, infos: dict):
        """Write the observation after step t into ``buf`` [T, N, ...], final observations where episodes ended."""
        if buf is None:
            buf = ({k: np.empty((T, *np.shape(v)), np.asarray(v).dtype) for k, v in next_obs.items()}
                   if isinstance(next_obs, dict) else np.empty((T, *np.shape(next_obs)), np.asarray(next_obs).dtype))
        if isinstance(buf, dict):
            for k in buf:
                buf[k][t] = next_obs[k]
        else:
            buf[t] = next_obs
        if done.any():
            for i in np.flatnonzero(done):
                final = infos["final_obs"][i]
                if final is None:  # unknown (a connector restarted mid-episode): the step is marked ended anyway
                    continue
                if isinstance(buf, dict):
                    for k in buf:
                        buf[k][t, i] = final[k]
                else:
                    buf[t, i] = final
        return buf

    def close(self) -> None:
        self.env.close()


def _obs_moments(batches: list):
    if isinstance(batches[0], dict):
        out = {}
        for k in batches[0]:
            x = np.stack([b[k] for b in batches]).astype(np.float64)
            x = x.reshape(-1, *x.shape[2:])
            out[k] = (x.mean(0), x.var(0), x.shape[0])
        return out
    x = np.stack(batches).astype(np.float64)
    x = x.reshape(-1, *x.shape[2:])
    return (x.mean(0), x.var(0), x.shape[0])
