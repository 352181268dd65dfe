"""RunConfig is an env run or an agent run, each with only its own sections; the other kind's sections,
policies and an agent section on an agent harness are one-line errors naming the key and the kind."""

from __future__ import annotations

import pytest

from polar.config import AgentRunConfig, EnvRunConfig, RunConfig, run_kind_of, validate, validate_run_config
from polar.errors import ConfigError

GYM = {"type": "gymnasium", "id": "CartPole-v1"}
AGENT = {"type": "agent", "command": ["my-agent"]}
LLM_ENV = {"harness": {"type": "gymnasium", "id": "FrozenLake-v1"}, "agent": {"type": "llm"}, "policy": {"type": "grpo"}}


def test_kind_follows_harness_and_agent_type():
    assert run_kind_of({"harness": GYM, "policy": {"type": "ppo"}}) == "env"
    assert run_kind_of({"harness": AGENT}) == "agent"
    assert run_kind_of(LLM_ENV) == "agent"  # the LLM agent on an env harness is an agent run
    env = validate_run_config({"harness": GYM, "policy": {"type": "ppo"}})
    agent = validate_run_config({"harness": AGENT, "policy": {"type": "grpo"}})
    llm = validate_run_config(LLM_ENV)
    assert (type(env), type(agent), type(llm)) == (EnvRunConfig, AgentRunConfig, AgentRunConfig)
    assert (env.kind, agent.kind, llm.kind) == ("env", "agent", "agent")
    assert llm.agent is not None and llm.agent.type == "llm" and agent.agent is None
    assert run_kind_of(env) == "env" and run_kind_of(llm) == "agent"
    # the same through the union itself
    assert type(validate(RunConfig, {"harness": GYM, "policy": {"type": "dqn"}})) is EnvRunConfig


def test_a_validated_config_revalidates_from_its_dump():
    for data in ({"harness": GYM, "policy": {"type": "sac"}}, {"harness": AGENT, "policy": {"type": "sft"}}, LLM_ENV):
        cfg = validate_run_config(data)
        again = validate_run_config(cfg.model_dump(mode="json"))
        assert again == cfg and type(again) is type(cfg)


@pytest.mark.parametrize(("data", "message"), [
    ({"harness": GYM, "policy": {"type": "ppo"}, "gateway": {}},
     "cfg.yaml: 'gateway' is a section of agent runs (harness.type: agent, or agent: {type: llm} on an env harness), "
     "and this is an env run (harness.type: gymnasium); remove it."),
    ({"harness": GYM, "policy": {"type": "ppo"}, "tasks": "train.jsonl"}, "'tasks' is a section of agent runs"),
    ({"harness": AGENT, "policy": {"type": "grpo"}, "eval": {"episodes": 3}},
     "cfg.yaml: 'eval' is a section of env runs (harness.type: gymnasium or custom, with a network agent), and this "
     "is an agent run (harness.type: agent); remove it."),
    ({**LLM_ENV, "total_env_steps": 1000},
     "'total_env_steps' is a section of env runs (harness.type: gymnasium or custom, with a network agent), and this "
     "is an agent run (agent.type: llm on harness.type: gymnasium); remove it."),
    ({"harness": GYM, "policy": {"type": "grpo"}},
     "policy.type 'grpo' trains agent runs (harness.type: agent, or agent: {type: llm} on an env harness), and this "
     "is an env run (harness.type: gymnasium): use ppo or appo or dqn or sac or bc or iql or cql or gail or airl or hierarchical or distill or mbpo."),
    ({"harness": AGENT, "policy": {"type": "ppo"}}, "policy.type 'ppo' trains env runs"),
    ({"harness": AGENT, "agent": {"type": "mlp"}, "policy": {"type": "grpo"}},
     "'agent': an agent harness (harness.type: agent) brings its own agent; remove the agent section"),
    ({"harness": {"type": "gymnasum", "id": "CartPole-v1"}, "policy": {"type": "ppo"}},
     "'harness.type': unknown type 'gymnasum' (did you mean: gymnasium?); use one of gymnasium, envpool, custom, pettingzoo, agent."),
    ({"harness": GYM, "agent": {"type": "lmm"}, "policy": {"type": "ppo"}},
     "'agent.type': unknown type 'lmm' (did you mean: llm, lstm?); use one of mlp, cnn, lstm, custom, llm."),
])
def test_a_section_of_the_other_kind_is_one_line(data, message):
    with pytest.raises(ConfigError) as e:
        validate_run_config(data, source="cfg.yaml")
    text = str(e.value)
    assert message in text and "\n" not in text, text


def test_unknown_keys_list_only_this_kinds_sections():
    with pytest.raises(ConfigError) as e:
        validate_run_config({"harness": AGENT, "policy": {"type": "grpo"}, "gatway": {}}, source="cfg.yaml")
    assert str(e.value) == ("cfg.yaml: unknown key 'gatway' (did you mean: gateway?). Valid keys here: agent, "
                            "distribution, eval_tasks, gateway, harness, logging, model, name, policy, seed, sessions, "
                            "sft_warmup, tasks, trajectory, verifier.")
    with pytest.raises(ConfigError, match=r"unknown key 'policy.kwargs.lerning_rate' \(did you mean: learning_rate"):
        validate_run_config({"harness": GYM, "policy": {"type": "ppo", "kwargs": {"lerning_rate": 1}}})
