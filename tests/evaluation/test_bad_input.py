"""Bad suites fail with one line naming the key; a job that cannot run is one error row, not a crash."""

from __future__ import annotations

import json

import pytest
import yaml

from polar.errors import ConfigError
from polar.evaluation.runner import run_job
from polar.evaluation.suite import load_suite
from tests.evaluation.helpers import EXAMPLES, make_env_run


def _suite(tmp_path, data):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    return load_suite(tmp_path / "s.yaml")


CART = {"name": "c", "harness": {"type": "gymnasium", "id": "CartPole-v1"}, "seeds": {"start": 10**6, "count": 3}}


@pytest.mark.parametrize("data, message", [
    ({"policies": [{"name": "a", "run": "r"}], "harnesses": [{**CART, "metrics": ["retrun"]}]},
     "unknown metric 'retrun' (did you mean: return?)"),
    ({"policies": [{"name": "a", "run": "r"}, {"name": "e", "ensemble": ["a", "b"]}], "harnesses": [CART]},
     "ensemble member 'b' is not a policy"),
    ({"policies": [{"name": "a", "run": "r"}], "harnesses": [{**CART, "metrics": ["constraint_violations"]}]},
     "constraint_violations needs info_key"),
    ({"policies": [{"name": "m", "model": "tiny"}], "harnesses": [CART]},
     "policy 'm' is a model; models run on agent harnesses only"),
    ({"policies": [{"name": "a", "run": "r", "checkpoint": "c.pt"}], "harnesses": [CART]},
     "needs exactly one of checkpoint, run, ensemble, model (got checkpoint, run)"),
    ({"policies": [{"name": "a", "run": "r"}], "harnesses": [{**CART, "policies": ["b"]}]},
     "harness 'c': policy 'b' is not defined"),
    ({"policies": [{"name": "m", "model": "tiny"}], "harnesses": [{"name": "g", "kind": "agent"}]},
     "needs 'config:'"),
    ({"policies": [{"name": "a", "run": "r"}], "harnesses": [{**CART, "wrappers": [{"type": "sticky_actions",
                                                                                     "prob": 1.5}]}]},
     "prob"),
])
def test_bad_suites_name_what_is_wrong(tmp_path, data, message):
    with pytest.raises(ConfigError) as e:
        _suite(tmp_path, data)
    assert message in str(e.value)
    assert str(tmp_path / "s.yaml") in str(e.value)


@pytest.fixture(scope="module")
def cart_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return make_env_run(root / "cartpole", EXAMPLES / "cartpole_ppo.yaml", seeds=(1, 2))


def _job(tmp_path, data, harness, policy):
    suite = _suite(tmp_path, data)
    return run_job(suite.model_dump(mode="json"), str(suite.base_dir), harness, policy, str(tmp_path / "out"))


def test_seeds_the_policy_trained_on_are_refused(tmp_path, cart_run):
    data = {"policies": [{"name": "a", "run": str(cart_run)}],
            "harnesses": [{**CART, "seeds": {"start": 0, "count": 5}}]}
    res = _job(tmp_path, data, "c", "a")
    assert res["episodes"] == []
    assert res["error"].startswith("harness 'c': seeds [0, 1, 2] of seeds [0, 5) were trained on by policy 'a'")


def test_a_missing_checkpoint_is_one_error_line(tmp_path, cart_run):
    data = {"policies": [{"name": "a", "checkpoint": str(cart_run / "checkpoints" / "ckpt_00000009.pt")}],
            "harnesses": [CART]}
    res = _job(tmp_path, data, "c", "a")
    assert res["error"].startswith("policy 'a': checkpoint") and "is not a file" in res["error"]


def test_distractor_features_on_a_policy_without_them_say_so(tmp_path, cart_run):
    data = {"policies": [{"name": "a", "run": str(cart_run)}],
            "harnesses": [{**CART, "wrappers": [{"type": "distractor_features", "count": 2}]}]}
    res = _job(tmp_path, data, "c", "a")
    assert res["error"] == ("harness 'c': its wrappers change observations from (4,) to (6,); policy 'a' takes (4,) "
                            "(distractor_features needs a policy trained with them)")


def test_a_policy_from_another_game_does_not_fit(tmp_path, cart_run):
    data = {"policies": [{"name": "a", "run": str(cart_run)}],
            "harnesses": [{**CART, "harness": {"type": "gymnasium", "id": "Acrobot-v1"}}]}
    res = _job(tmp_path, data, "c", "a")
    assert res["error"].startswith("policy 'a' (") and "does not fit harness 'c'" in res["error"]


def test_seeds_of_a_run_that_left_envs_per_worker_unset_are_refused(tmp_path):
    """envs_per_worker unset means 8 learner envs (rollout_workers 0): the held-out check counted range(None) and
    the job ended in a TypeError instead of naming the clash."""
    run = make_env_run(tmp_path / "cart8", EXAMPLES / "cartpole_ppo.yaml", seeds=(1,),
                       overrides=["distribution.envs_per_worker=null"])
    data = {"policies": [{"name": "a", "run": str(run)}], "harnesses": [{**CART, "seeds": {"start": 5, "count": 5}}]}
    res = _job(tmp_path, data, "c", "a")
    assert res["error"].startswith("harness 'c': seeds [5, 6, 7] of seeds [5, 10) were trained on by policy 'a'")


def test_agent_tasks_from_a_generated_source_ask_for_a_task_file(tmp_path):
    from polar.config import load_config
    from polar.evaluation.runner import agent_tasks
    from polar.evaluation.suite import EvalSuite

    cfg = load_config(EXAMPLES / "llm_frozenlake.yaml")  # eval_tasks: {source: seeds, ...}
    suite = EvalSuite.model_validate({"policies": [{"name": "m", "model": "tiny"}],
                                      "harnesses": [{"name": "g", "kind": "agent", "config": "x.yaml"}]})
    with pytest.raises(ConfigError, match=r"harness 'g': its config's eval_tasks is a generated task source .*; set "
                                          r"'tasks: FILE.jsonl'"):
        agent_tasks(suite, suite.harnesses[0], cfg)


def test_an_env_run_on_an_agent_harness_says_so(tmp_path, cart_run):
    data = {"policies": [{"name": "a", "run": str(cart_run)}],
            "harnesses": [{"name": "g", "kind": "agent", "config": str(EXAMPLES / "agentic" / "calculator_grpo.yaml")}]}
    res = _job(tmp_path, data, "g", "a")
    assert res["error"].startswith("policy 'a' comes from an env run (") and "evaluate it on a 'kind: env' harness" \
        in res["error"], res["error"]


def test_agent_tasks_that_are_the_training_tasks_are_refused(tmp_path):
    data = {"policies": [{"name": "m", "model": "tiny"}],
            "harnesses": [{"name": "g", "kind": "agent", "config": str(EXAMPLES / "agentic" / "calculator_grpo.yaml"),
                           "tasks": str(EXAMPLES / "agentic" / "train.jsonl")}]}
    res = _job(tmp_path, data, "g", "m")
    assert res["error"].startswith("harness 'g': tasks ") and "is the training task file of its config" in res["error"]


def test_an_ensemble_of_runs_with_different_spaces_is_refused(tmp_path, cart_run):
    other = make_env_run(tmp_path / "acro", EXAMPLES / "cartpole_ppo.yaml", seeds=(5,),
                         overrides=["harness.id=Acrobot-v1"])
    data = {"policies": [{"name": "a", "run": str(cart_run)}, {"name": "b", "run": str(other)},
                         {"name": "e", "ensemble": ["a", "b"]}], "harnesses": [CART]}
    res = _job(tmp_path, data, "c", "e")
    assert "policy 'b' (" in res["error"] and "does not fit harness 'c'" in res["error"]
    assert json.dumps(res)  # plain data, as it crosses the process boundary


def test_a_harness_config_may_be_a_run_directory(tmp_path, cart_run):
    from polar.evaluation.runner import load_harness_config

    suite = _suite(tmp_path, {"policies": [{"name": "a", "run": str(cart_run)}],
                              "harnesses": [{"name": "c", "config": str(cart_run)},
                                            {"name": "y", "config": str(EXAMPLES / "keydoor" / "demo.yaml")}]})
    run_cfg = load_harness_config(suite, suite.harnesses[0])
    assert run_cfg.harness.id == "CartPole-v1" and run_cfg.config_dir == EXAMPLES
    yaml_cfg = load_harness_config(suite, suite.harnesses[1])
    assert yaml_cfg.harness.type == "custom" and yaml_cfg.config_dir == EXAMPLES / "keydoor"


def test_a_missing_suite_file_says_so(tmp_path):
    with pytest.raises(ConfigError, match=r"suite file .*nope.yaml is not found; pass a suite YAML to --suite"):
        load_suite(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_suite(tmp_path)


@pytest.mark.parametrize("argv, message", [
    ([], "polar eval needs a run directory or checkpoint (polar eval RUN), or --suite FILE"),
    (["runs/x", "--suite", "s.yaml"], "give either a run (polar eval RUN) or --suite FILE, not both"),
])
def test_polar_eval_needs_a_run_or_a_suite(argv, message):
    import argparse

    from polar.cli import eval_cmd

    parser = argparse.ArgumentParser()
    eval_cmd.add_arguments(parser)
    with pytest.raises(ConfigError) as e:
        eval_cmd.main(parser.parse_args(argv))
    assert str(e.value).startswith(message)
