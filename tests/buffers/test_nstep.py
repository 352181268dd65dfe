"""n-step transitions: the accumulator against a brute-force reference over whole env streams, across
fragment boundaries, interleaved workers, episode ends and a replaced worker."""

from __future__ import annotations

import numpy as np
import pytest

from polar.buffers.nstep import NStepTransitions
from polar.types import Fragment

GAMMA = 0.9


def fragment(worker: int, start: int, T: int, N: int, rng, done_p: float = 0.2, fresh: bool = False):
    """obs encodes (worker, env, global step); next_obs = that code + 0.5 so every pairing is checkable."""
    t = np.arange(start, start + T)[:, None]
    n = np.arange(N)[None, :]
    code = (worker * 1_000_000 + n * 10_000 + t).astype(np.float32)
    term = rng.random((T, N)) < done_p / 2
    trunc = (rng.random((T, N)) < done_p / 2) & ~term
    starts = np.zeros((T, N), np.float32)
    starts[1:] = (term | trunc)[:-1]
    if fresh:
        starts[0] = 1.0
    z = np.zeros((T, N), np.float32)
    return Fragment(obs=code[..., None], actions=code.astype(np.int64) % 7, log_probs=z, values=z,
                    rewards=rng.normal(size=(T, N)).astype(np.float32), terminated=term.astype(np.float32),
                    truncated=trunc.astype(np.float32), episode_starts=starts, trunc_values=z,
                    last_values=np.zeros(N, np.float32), worker_id=worker, next_obs=code[..., None] + 0.5)


def reference(frags: list[Fragment], n: int) -> set:
    """Per (worker, env) stream: every step but the last n - 1, its window closed after n steps or by an episode end."""
    out = set()
    streams: dict[tuple[int, int], list] = {}
    for f in frags:
        for e in range(f.num_envs):
            s = streams.setdefault((f.worker_id, e), [])
            if s and f.episode_starts[0, e] and not s[-1]["done"]:
                s[-1]["done"] = True  # a fresh worker: the stream was cut
            for t in range(f.num_steps):
                s.append({"obs": float(f.obs[t, e, 0]), "a": int(f.actions[t, e]), "r": float(f.rewards[t, e]),
                          "next": float(f.next_obs[t, e, 0]), "term": float(f.terminated[t, e]),
                          "done": bool(f.terminated[t, e] or f.truncated[t, e])})
    for s in streams.values():
        for i in range(len(s) - (n - 1)):  # the last n - 1 steps of a stream wait for its next fragment
            ret, m = 0.0, 0
            for k in range(n):
                ret += GAMMA ** k * s[i + k]["r"]
                m = k + 1
                if s[i + k]["done"]:
                    break
            last = s[i + m - 1]
            out.add((s[i]["obs"], s[i]["a"], round(ret, 4), last["next"], last["term"], m))
    return out


def emitted(acc: NStepTransitions, frags: list[Fragment]) -> set:
    out = set()
    for f in frags:
        tr = acc(f)
        if tr is None:
            continue
        for i in range(len(tr["rewards"])):
            out.add((float(tr["obs"][i, 0]), int(tr["actions"][i]), round(float(tr["rewards"][i]), 4),
                     float(tr["next_obs"][i, 0]), float(tr["terminated"][i]), int(tr["steps"][i])))
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_matches_the_brute_force_reference_across_fragments_and_workers(n):
    rng = np.random.default_rng(n)
    frags, pos = [], {0: 0, 1: 0}
    for i in range(12):  # two workers, interleaved, fragments of 1-4 steps (some shorter than n)
        w = i % 2 if i < 8 else 1
        T = int(rng.integers(1, 5))
        frags.append(fragment(w, pos[w], T, 3, rng))
        pos[w] += T
    got = emitted(NStepTransitions(n, GAMMA), frags)
    want = reference(frags, n)
    assert got == want
    assert len(got) >= sum(f.env_steps for f in frags) - 2 * 3 * (n - 1)  # at most n-1 pending per stream


def test_n_step_reward_discounting_and_episode_end_by_hand():
    rng = np.random.default_rng(0)
    f = fragment(0, 0, 4, 1, rng, done_p=0.0)
    f.rewards[:, 0] = [1.0, 2.0, 4.0, 8.0]
    f.terminated[2, 0] = 1.0  # the episode terminates at step 2
    tr = NStepTransitions(3, 0.5)(f)
    # ready: steps 0 and 1 (the last n-1 = 2 wait for the next fragment)
    np.testing.assert_allclose(tr["rewards"], [1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4])
    np.testing.assert_array_equal(tr["steps"], [3, 2])
    np.testing.assert_array_equal(tr["terminated"], [1, 1])
    np.testing.assert_array_equal(tr["next_obs"][:, 0], [2.5, 2.5])


def test_a_replaced_worker_closes_the_held_windows_and_they_bootstrap():
    rng = np.random.default_rng(1)
    acc = NStepTransitions(3, GAMMA)
    first = fragment(0, 0, 3, 1, rng, done_p=0.0)
    acc(first)
    second = fragment(0, 100, 3, 1, rng, done_p=0.0, fresh=True)  # same worker id, a fresh env
    tr = acc(second)
    held = {float(o): (float(nx), int(m), float(te)) for o, nx, m, te in
            zip(tr["obs"][:, 0], tr["next_obs"][:, 0], tr["steps"], tr["terminated"], strict=True)}
    assert held[1.0] == (2.5, 2, 0.0)  # closed at the last held step, not terminal: bootstraps from its next_obs
    assert held[2.0] == (2.5, 1, 0.0)
    assert 100.0 in held and held[100.0][0] == 102.5  # the new stream does not reach back into the old one
