"""The manager's credit assignment: SMDP returns and GAE over options, checked against hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polar.algorithms.advantages import compute_gae, rollout_gae
from polar.algorithms.hierarchical import option_return
from polar.buffers.rollout_buffer import RolloutBuffer
from polar.types import Fragment


def test_option_return_is_the_discounted_sum_over_the_option():
    # 1 + 0.9 * 0 + 0.81 * 2 = 2.62
    assert option_return([1.0, 0.0, 2.0], 0.9) == pytest.approx(2.62)
    assert option_return([], 0.9) == 0.0
    assert option_return([-0.01] * 4, 1.0) == pytest.approx(-0.04)


def _decisions(durations: list[int] | None) -> Fragment:
    """Two manager decisions of one copy: R0 = 2.62 over tau0 = 3 steps, V0 = 1.0; R1 = 1.0 over tau1 = 2 steps,
    V1 = 0.5, ending the episode (terminated)."""
    col = lambda xs: np.asarray(xs, np.float32).reshape(-1, 1)  # noqa: E731
    return Fragment(obs=col([0.0, 1.0]), actions=np.zeros((2, 1), np.int64), log_probs=col([0.0, 0.0]),
                    values=col([1.0, 0.5]), rewards=col([2.62, 1.0]), terminated=col([0, 1]), truncated=col([0, 0]),
                    episode_starts=col([1, 0]), trunc_values=col([0, 0]), last_values=np.zeros(1, np.float32),
                    durations=None if durations is None else col(durations))


def test_gae_over_options_discounts_each_decision_by_gamma_to_its_duration():
    gamma, lam = 0.9, 0.5
    adv, ret = rollout_gae(RolloutBuffer([_decisions([3, 2])]), gamma, lam)
    # by hand: delta1 = 1.0 - 0.5 = 0.5 (terminal); A1 = 0.5
    #          delta0 = 2.62 + 0.9**3 * 0.5 - 1.0 = 1.9845; A0 = 1.9845 + 0.9**3 * 0.5 * 0.5 = 2.16675
    assert adv[:, 0].tolist() == pytest.approx([2.16675, 0.5], abs=1e-5)
    assert ret[:, 0].tolist() == pytest.approx([3.16675, 1.0], abs=1e-5)


def test_a_truncated_decision_bootstraps_with_gamma_to_its_duration():
    frag = _decisions([3, 4])
    frag.terminated[1] = 0.0
    frag.truncated[1] = 1.0
    frag.trunc_values[1] = 2.0  # V of where the option was cut
    adv, _ = rollout_gae(RolloutBuffer([frag]), 0.9, 1.0)
    # delta1 = 1.0 + 0.9**4 * 2.0 - 0.5 = 1.8122
    assert float(adv[1, 0]) == pytest.approx(1.8122, abs=1e-5)


def test_without_durations_every_step_is_one_env_step():
    adv, _ = rollout_gae(RolloutBuffer([_decisions(None)]), 0.9, 0.5)
    # delta0 = 2.62 + 0.9 * 0.5 - 1.0 = 2.07; A0 = 2.07 + 0.9 * 0.5 * 0.5 = 2.295
    assert adv[:, 0].tolist() == pytest.approx([2.295, 0.5], abs=1e-5)


def test_compute_gae_takes_a_scalar_or_one_discount_per_step():
    r = np.array([[1.0], [1.0]], np.float32)
    v = np.zeros((2, 1), np.float32)
    d = np.zeros((2, 1), np.float32)
    last = np.array([1.0], np.float32)
    a_scalar, _ = compute_gae(r, v, d, last, 0.5, 1.0)
    a_array, _ = compute_gae(r, v, d, last, np.full((2, 1), 0.5, np.float32), 1.0)
    a_torch, _ = compute_gae(torch.from_numpy(r), torch.from_numpy(v), torch.from_numpy(d), torch.from_numpy(last),
                             torch.full((2, 1), 0.5), 1.0)
    assert a_scalar.tolist() == a_array.tolist() == a_torch.tolist() == [[1.75], [1.5]]
