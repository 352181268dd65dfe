"""Env episodes for an evaluation: one episode per held-out seed, ``num_envs`` single envs stepped together.

Episode ``k`` is reset with ``seeds[k]`` and runs to its end on one env, so its outcome depends only on
its seed and the policy, not on how episodes were spread over envs or processes: a direct loop over the
same seeds gives the same numbers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from polar.agents import check_act_output
from polar.rollout.runner import obs_to_tensor


def _stack(items: list[Any], space: gym.Space) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: np.stack([np.asarray(o[k]) for o in items]) for k in space.spaces}
    return np.stack([np.asarray(o) for o in items])


def _count(value: Any) -> float:
    """An info value as a violation count: True/False -> 1/0, a number -> itself, else truthiness."""
    if isinstance(value, (bool, np.bool_)):
        return float(bool(value))
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    return float(bool(value))


@torch.inference_mode()
def run_env_episodes(actor: Any, envs: list[gym.Env], seeds: list[int], deterministic: bool = True,
                     max_episode_steps: int = 100_000, info_keys: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One record per seed, in seed order: ``seed``, ``return``, ``episode_length``, ``success`` (the final
    ``info["success"]``, None when absent), ``terminated``, ``truncated``, ``time_to_completion_s`` (the
    episode's env step time plus its share of the batched forward passes) and ``info_counts``."""
    n = min(len(envs), len(seeds))
    envs = envs[:n]
    space = envs[0].action_space
    obs_space = envs[0].observation_space
    pending = deque(enumerate(seeds))
    results: list[dict[str, Any] | None] = [None] * len(seeds)
    slots: list[dict[str, Any] | None] = [None] * n
    obs: list[Any] = [None] * n

    def start(i: int) -> None:
        k, seed = pending.popleft()
        t = time.perf_counter()
        o, _ = envs[i].reset(seed=int(seed))
        slots[i] = {"k": k, "seed": int(seed), "ret": 0.0, "len": 0, "t": time.perf_counter() - t,
                    "counts": dict.fromkeys(info_keys, 0.0)}
        obs[i] = o

    for i in range(n):
        start(i)
    state = actor.get_initial_state(n)
    initial = actor.get_initial_state(n)
    while any(s is not None for s in slots):
        live = sum(s is not None for s in slots)
        t = time.perf_counter()
        action, state, _ = actor.act(obs_to_tensor(_stack(obs, obs_space)), state, deterministic)
        acts = check_act_output(actor.agent, action, n, space)
        if isinstance(space, gym.spaces.Box):
            acts = np.clip(acts, space.low, space.high)
        share = (time.perf_counter() - t) / live
        starts = np.zeros(n, dtype=bool)
        for i in range(n):
            s = slots[i]
            if s is None:
                continue
            t = time.perf_counter()
            a = acts[i].item() if isinstance(space, gym.spaces.Discrete) else acts[i]
            o, r, term, trunc, info = envs[i].step(a)
            s["t"] += time.perf_counter() - t + share
            s["ret"] += float(r)
            s["len"] += 1
            for key in info_keys:
                if key in info:
                    s["counts"][key] += _count(info[key])
            cut = s["len"] >= max_episode_steps
            if term or trunc or cut:
                succ = info.get("success") if isinstance(info, dict) else None
                results[s["k"]] = {
                    "seed": s["seed"], "return": s["ret"], "episode_length": s["len"],
                    "success": None if succ is None else bool(succ), "terminated": bool(term),
                    "truncated": bool(trunc or (cut and not term)), "time_to_completion_s": s["t"],
                    "info_counts": s["counts"],
                }
                if pending:
                    start(i)
                    starts[i] = True
                else:
                    slots[i] = None
            else:
                obs[i] = o
        if starts.any() and state is not None:
            state = actor.reset_state(state, initial, torch.from_numpy(starts))
    return [r for r in results if r is not None]


def make_envs(make_one: Callable[[], gym.Env], count: int) -> list[gym.Env]:
    """``count`` envs from ``make_one``; the ones already built are closed if a later one fails."""
    envs: list[gym.Env] = []
    try:
        for _ in range(count):
            envs.append(make_one())
    except BaseException:
        for e in envs:
            e.close()
        raise
    return envs
