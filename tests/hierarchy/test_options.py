"""The option mechanics of hierarchical runs: when the manager decides, what each policy's fragment holds, the
collector's checkpoint state, and bad input (subgoals the env does not report)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.config.agent import BuiltinAgentConfig
from polar.errors import ConfigError
from polar.models.loader import build_agent
from polar.models.policy import Policy
from polar.rollout.options import OptionCollector, Skill, manager_observation_space, play_option_episodes
from tests.hierarchy.envs import Tick


def _policy(obs_space: gym.Space[Any], act_space: gym.Space[Any]) -> Policy:
    return Policy(build_agent(BuiltinAgentConfig(type="mlp", hidden_sizes=[8]), obs_space, act_space))


def _collector(skills: list[tuple[str, str | None]], option_steps: int, steps: int = 20, num_envs: int = 2,
               length: int = 50, report: bool = True, initiation_sets: bool = True,
               requires: dict[str, tuple[str, ...]] | None = None) -> OptionCollector:
    torch.manual_seed(0)
    env = gym.vector.SyncVectorEnv([lambda: Tick(length, report) for _ in range(num_envs)],
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs, act = env.single_observation_space, env.single_action_space
    manager = _policy(manager_observation_space(obs, len(skills), initiation_sets), gym.spaces.Discrete(len(skills)))
    specs = [Skill(name, _policy(obs, act), subgoal, "subgoal" if subgoal else "extrinsic", f"policy.kwargs.skills[{i}]",
                   (requires or {}).get(name, ()))
             for i, (name, subgoal) in enumerate(skills)]
    return OptionCollector(env, manager, specs, option_steps, 0.9, 1.0, steps, seed=0, env_name="env Tick",
                           initiation_sets=initiation_sets)


def test_an_option_ends_after_option_steps_when_its_subgoal_never_holds():
    c = _collector([("never", "never")], option_steps=4, steps=20)
    c.start({}, 0)
    batch = c.collect()
    m = batch.data.manager
    assert m is not None
    durations = m.buffer.durations[:, 0].tolist()
    assert durations == [4.0] * 10  # 2 copies x 20 steps: every option lasts exactly k = 4 steps
    # each option's reward is its discounted return: 1 + 0.9 + 0.81 + 0.729
    assert m.buffer.rewards[:, 0].tolist() == pytest.approx([3.439] * 10)
    # the skill's episodes are cut at k steps (truncated, bootstrapped), never terminated
    s = batch.data.skills["never"].buffer
    assert s.truncated[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0] * 10 and s.terminated.sum() == 0
    assert s.rewards.sum() == 0.0  # a subgoal skill earns only at its subgoal
    assert batch.data.stats["options/reached/never"] == 0.0 and batch.data.stats["options/length_mean"] == 4.0
    assert batch.env_steps == 40


def test_an_option_ends_when_its_subgoal_holds_before_k_steps():
    c = _collector([("tick", "tick")], option_steps=8, steps=20, num_envs=1)
    c.start({}, 0)
    batch = c.collect()
    m = batch.data.manager
    assert m is not None
    # the subgoal holds at t = 5, 10, 15, 20: every option ends there, 5 steps in (k = 8 never comes)
    assert m.buffer.durations[:, 0].tolist() == [5.0] * 4
    s = batch.data.skills["tick"].buffer
    assert s.terminated[:, 0].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0] * 4
    assert s.rewards[:, 0].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0] * 4  # subgoal_reward when it came to hold
    assert batch.data.stats["options/reached/tick"] == 1.0


def test_k_and_the_subgoal_together_and_decisions_cover_every_step():
    c = _collector([("tick", "tick")], option_steps=3, steps=20, num_envs=1)
    c.start({}, 0)
    m = c.collect().data.manager
    assert m is not None
    # from t=0: 3 steps (k), then 2 (the subgoal at t=5), 3, 2, ...: every 3 steps or sooner
    assert m.buffer.durations[:, 0].tolist() == [3.0, 2.0] * 4
    assert float(m.buffer.durations.sum()) == 20.0


def test_a_decision_still_running_at_the_batch_end_waits_for_the_next_batch():
    c = _collector([("never", "never")], option_steps=6, steps=10, num_envs=1)
    c.start({}, 0)
    first = c.collect().data.manager
    assert first is not None and first.buffer.durations[:, 0].tolist() == [6.0]
    # the decision before the cut bootstraps from the one after it (taken, not yet complete)
    assert first.buffer.truncated[0, 0] == 1.0 and first.buffer.trunc_values[0, 0] != 0.0
    assert c.state_dict()["options"] == {"active_skill": ["never"], "option_age": [4]}
    second = c.collect().data.manager
    assert second is not None and second.buffer.durations[:, 0].tolist() == [6.0, 6.0]  # 4 + 2 steps, then 6


def test_an_episode_end_ends_the_option_and_the_decision():
    c = _collector([("never", "never")], option_steps=4, steps=12, num_envs=1, length=6)
    c.start({}, 0)
    batch = c.collect()
    m = batch.data.manager
    assert m is not None
    # episodes of 6 steps: options of 4, then 2 (the time limit), twice
    assert m.buffer.durations[:, 0].tolist() == [4.0, 2.0, 4.0, 2.0]
    assert m.buffer.truncated[:, 0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert batch.episode_lengths == [6, 6] and batch.episode_successes == [1.0, 1.0]


def test_initiation_sets_mask_a_skill_whose_subgoal_holds():
    c = _collector([("tick", "tick"), ("never", "never")], option_steps=8, steps=1, num_envs=1)
    c.start({}, 0)  # t = 0: 'tick' holds, so only 'never' may be picked
    assert c.available(0).tolist() == [0, 1]
    for _ in range(5):
        c.start({}, 0)
        c.decide(deterministic=False)
        assert c.skills[int(c.active[0])].name == "never"
    off = _collector([("tick", "tick"), ("never", "never")], option_steps=8, steps=1, num_envs=1,
                     initiation_sets=False)
    off.start({}, 0)
    assert off.available(0).tolist() == [1, 1]
    assert not isinstance(off.manager_obs(np.array([0])), dict)  # no mask in the manager's observation


def test_a_skill_that_requires_a_subgoal_is_picked_only_where_it_holds():
    c = _collector([("tick", "tick"), ("never", "never")], option_steps=8, steps=1, num_envs=1,
                   requires={"never": ("tick",)})
    c.start({}, 0)  # t = 0: 'tick' holds: 'tick' is masked (its subgoal holds), 'never' may start (it requires tick)
    assert c.available(0).tolist() == [0, 1]
    c.held[0]["tick"] = False  # between multiples of 5: 'never' lacks its requirement, 'tick' may start
    assert c.available(0).tolist() == [1, 0]


def test_the_collector_state_names_the_active_skill_and_loads_back():
    c = _collector([("tick", "tick"), ("never", "never")], option_steps=8, steps=3, num_envs=2)
    c.start({}, 0)
    c.collect()
    state = c.state_dict()
    assert all(a in ("tick", "never") for a in state["options"]["active_skill"])
    fresh = _collector([("tick", "tick"), ("never", "never")], option_steps=8, steps=3, num_envs=2)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    assert [fresh.skills[a].name for a in fresh.active] == state["options"]["active_skill"]


def test_a_subgoal_the_env_does_not_report_is_an_error_naming_the_key():
    c = _collector([("tick", "tick")], option_steps=4, steps=4, num_envs=1, report=False)
    c.start({}, 0)
    with pytest.raises(ConfigError, match=r"policy\.kwargs\.skills\[0\]\.subgoal 'tick': env Tick reports no "
                                          r"info\['subgoal_tick'\]"):
        c.collect()


def test_evaluation_plays_whole_episodes_split_over_the_copies():
    c = _collector([("tick", "tick"), ("never", "never")], option_steps=8, num_envs=2, length=7)
    c.record = False
    res = play_option_episodes(c, 5, deterministic=True)
    assert res["episodes"] == 5 and res["lengths"] == [7] * 5 and res["success_rate"] == 1.0
    assert set(res["picked"]) == {"tick", "never"}
