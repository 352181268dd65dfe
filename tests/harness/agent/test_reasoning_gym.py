"""reasoning-gym datasets as tasks: seeded, disjoint splits, curriculum levels, score_answer as verifier."""

import pytest

from polar.config.base import validate
from polar.config.llm_agent import ReasoningGymTasks, overlapping_seeds
from polar.errors import ConfigError
from polar.harness.benchmarks import reasoning_gym as rg
from polar.harness.benchmarks.sources import load_run_tasks


def test_tasks_are_seeded_and_splits_with_disjoint_seeds_share_no_item():
    train = load_run_tasks(ReasoningGymTasks(name="chain_sum", size=50, seed=0))
    again = load_run_tasks(ReasoningGymTasks(name="chain_sum", size=50, seed=0))
    held = load_run_tasks(ReasoningGymTasks(name="chain_sum", size=50, seed=50))
    assert [t["prompt"] for t in train] == [t["prompt"] for t in again]
    assert {t["id"] for t in train}.isdisjoint({t["id"] for t in held})
    assert train[0]["id"] == "chain_sum-0" and held[0]["id"] == "chain_sum-50"
    assert train[0]["prompt"].endswith("Give only the final answer on the last line.")
    assert overlapping_seeds(ReasoningGymTasks(name="chain_sum", size=50, seed=0),
                             ReasoningGymTasks(name="chain_sum", size=50, seed=49)) is not None
    assert overlapping_seeds(ReasoningGymTasks(name="chain_sum", size=50, seed=0),
                             ReasoningGymTasks(name="basic_arithmetic", size=50, seed=0)) is None


def test_curriculum_levels_set_the_difficulty():
    easy = load_run_tasks(ReasoningGymTasks(name="chain_sum", size=20, seed=1,
                                            curriculum={"num_terms": 0, "num_digits": 0}))
    assert all(t["rg_entry"]["metadata"]["num_terms"] == 2 and t["rg_entry"]["metadata"]["num_digits"] == 1
               for t in easy)
    with pytest.raises(ConfigError, match="no curriculum attribute 'terms'"):
        load_run_tasks(ReasoningGymTasks(name="chain_sum", size=2, curriculum={"terms": 0}))
    with pytest.raises(ConfigError, match="out of range"):
        load_run_tasks(ReasoningGymTasks(name="chain_sum", size=2, curriculum={"num_terms": 99}))
    with pytest.raises(ConfigError, match=r"no dataset 'chain_summ'.*chain_sum"):
        load_run_tasks(ReasoningGymTasks(name="chain_summ", size=2))


def test_score_answer_is_the_verifier():
    task = load_run_tasks(ReasoningGymTasks(name="basic_arithmetic", size=1, seed=7))[0]
    right = rg.verify(task, f"Let me think.\n{task['answer']}")
    assert right["reward"] == 1.0 and right["got"] == task["answer"]
    assert rg.verify(task, "I do not know")["reward"] == 0.0
    assert rg.verify(task, f"ANSWER: {task['answer']}", answer_pattern=r"ANSWER: (\S+)")["reward"] == 1.0
    with pytest.raises(Exception, match="source: reasoning_gym"):
        rg.verify({"id": "x", "prompt": "p"}, "1")


def test_a_run_config_names_a_reasoning_gym_harness():
    from polar.config.run import RunConfig

    cfg = validate(RunConfig, {
        "harness": {"type": "agent", "callable": "polar.harness.benchmarks.chat:answer"},
        "tasks": {"source": "reasoning_gym", "name": "chain_sum", "size": 10, "seed": 0},
        "eval_tasks": {"source": "reasoning_gym", "name": "chain_sum", "size": 10, "seed": 10},
        "verifier": {"type": "reasoning_gym"}, "policy": {"type": "grpo"}})
    assert cfg.tasks.name == "chain_sum" and cfg.verifier.type == "reasoning_gym"
    with pytest.raises(ConfigError, match=r"share seeds 5\.\.9"):
        validate(RunConfig, {
            "harness": {"type": "agent", "callable": "polar.harness.benchmarks.chat:answer"},
            "tasks": {"source": "reasoning_gym", "name": "chain_sum", "size": 10, "seed": 0},
            "eval_tasks": {"source": "reasoning_gym", "name": "chain_sum", "size": 10, "seed": 5},
            "policy": {"type": "grpo"}})
