"""n-step transitions from rollout fragments, before they enter the replay buffer.

The transition of step t becomes ``(obs_t, a_t, sum_{k<m} gamma^k r_{t+k}, next_obs_{t+m-1},
terminated_{t+m-1}, m)`` with ``m = n`` or fewer where the episode ends first; the learner discounts
its bootstrap by ``gamma ** m``. Windows cross fragment boundaries: the last ``n - 1`` steps of each
worker's fragment wait for that worker's next fragment. A fragment that starts a fresh episode where
the held steps had not ended one (a replaced worker) closes those windows early, bootstrapping from the
last observation they reached. Held steps are not checkpointed: a resumed run loses at most ``n - 1``
transitions per env.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from polar.types import Fragment


def _cat(a: Any, b: Any) -> Any:
    if isinstance(a, dict):
        return {k: np.concatenate([a[k], b[k]]) for k in a}
    return np.concatenate([a, b])


def _slice(x: Any, sl: slice) -> Any:
    return {k: v[sl] for k, v in x.items()} if isinstance(x, dict) else x[sl]


def _pick(x: Any, t: np.ndarray, env: np.ndarray) -> Any:
    return {k: v[t, env] for k, v in x.items()} if isinstance(x, dict) else x[t, env]


class NStepTransitions:
    """Turns fragments into n-step transitions for ``ReplayBuffer.add``, one stream per (worker, env)."""

    def __init__(self, n_steps: int, gamma: float) -> None:
        if n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")
        self.n = int(n_steps)
        self.gamma = float(gamma)
        self._held: dict[int, dict[str, Any]] = {}  # worker_id -> the last n - 1 steps, time-major

    def forget(self, worker_id: int) -> None:
        """Drop the steps held for ``worker_id``: its next fragment does not continue them (one was dropped)."""
        self._held.pop(worker_id, None)

    def __call__(self, frag: Fragment) -> dict[str, Any] | None:
        """The transitions now complete, as keyword arguments for ``ReplayBuffer.add`` (None if none)."""
        new = {"obs": frag.obs, "next_obs": frag.next_obs,
               "actions": np.asarray(frag.actions), "rewards": np.asarray(frag.rewards, np.float32),
               "terminated": np.asarray(frag.terminated, np.float32),
               "done": np.logical_or(frag.terminated, frag.truncated)}
        held = self._held.pop(frag.worker_id, None)
        if held is not None and held["done"].shape[1] == new["done"].shape[1]:
            # a fragment that opens a fresh episode where the held steps were mid-episode: close them there
            fresh = np.asarray(frag.episode_starts[0]) > 0
            held["done"][-1] |= fresh
            new = {k: _cat(held[k], new[k]) for k in new}
        T = new["done"].shape[0]
        keep = min(self.n - 1, T)
        if keep:
            held = {k: _slice(v, slice(T - keep, T)) for k, v in new.items()}
            held["done"] = held["done"].copy()  # may be marked later; the fragment's own array stays as it was
            self._held[frag.worker_id] = held
        ready = T - keep
        if ready <= 0:
            return None
        return self._windows(new, ready)

    def _windows(self, s: dict[str, Any], ready: int) -> dict[str, Any]:
        """n-step transitions for the first ``ready`` steps of ``s`` (every window fits in ``s``)."""
        N = s["done"].shape[1]
        t0 = np.arange(ready)[:, None].repeat(N, 1)
        env = np.arange(N)[None, :].repeat(ready, 0)
        rewards = np.zeros((ready, N), np.float32)
        steps = np.zeros((ready, N), np.float32)
        last = t0.copy()
        open_ = np.ones((ready, N), bool)
        t: np.ndarray
        for k in range(self.n):  # t0 + k < T for every window: only the first T - (n - 1) steps are ready
            t = t0 + k
            rewards += np.where(open_, (self.gamma ** k) * s["rewards"][t, env], 0.0).astype(np.float32)
            steps += open_
            last = np.where(open_, t, last)
            open_ = open_ & ~s["done"][t, env]

        def rows(x: np.ndarray) -> np.ndarray:
            return x.reshape(ready * N, *x.shape[2:])

        def obs_rows(o: np.ndarray | dict[str, np.ndarray], t: np.ndarray) -> np.ndarray | dict[str, np.ndarray]:
            picked = _pick(o, t, env)
            return {k: rows(v) for k, v in picked.items()} if isinstance(picked, dict) else rows(picked)

        return {"obs": obs_rows(s["obs"], t0), "next_obs": obs_rows(s["next_obs"], last),
                "actions": rows(s["actions"][t0, env]), "rewards": rows(rewards),
                "terminated": rows(s["terminated"][last, env]), "steps": rows(steps)}
