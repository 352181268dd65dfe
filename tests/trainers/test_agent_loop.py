"""An agent run is the one training loop, composed (issue 34): a session collector beside the sessions, a
GRPO learner that takes the step's session groups itself (``update(batch)``), SFT as a learner whose warm-up
is the loop's first stage, and a typed stack builder."""

import re
from pathlib import Path

import torch

from polar.algorithms.grpo import GRPOLearner
from polar.algorithms.sft import SFTLearner, demonstration_batches, sft_steps
from polar.config.grpo import GRPOKwargs, SFTKwargs
from polar.inference.tiny import build_tiny
from polar.models.llm_policy import LLMPolicy
from polar.rollout.sessions.collector import DemonstrationCollector, SessionCollector
from polar.types import Batch, Collector, Learner, SessionResult, SessionStatus, TrajectorySample

ROOT = Path(__file__).resolve().parents[2]


def _sample(i: int, version: int, length: int = 10) -> TrajectorySample:
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(3, 200, (length,), generator=g).tolist()
    return TrajectorySample(session_id=f"s{i}", token_ids=ids, loss_mask=[0] * 4 + [1] * (length - 4),
                            logprobs=[-5.0] * length, policy_versions=[version] * length, call_indices=[0] * length,
                            metadata={"min_policy_version": version})


def _group(first: int, rewards: list[float], version: int = 0) -> list[SessionResult]:
    return [SessionResult(session_id=f"s{first + i}", task_id="t", group_id=f"g{first}", sample_index=i,
                          status=SessionStatus.DONE, reward=r, samples=[_sample(first + i, version)])
            for i, r in enumerate(rewards)]


def _learner(**kwargs: object) -> GRPOLearner:
    model, tok = build_tiny(0)
    return GRPOLearner(LLMPolicy(model, tok, None), GRPOKwargs(micro_batch_size=4, learning_rate=1e-2, **kwargs))


def test_the_agent_learners_and_collectors_are_the_loops_learners_and_collectors():
    assert issubclass(GRPOLearner, Learner) and issubclass(SFTLearner, Learner)
    assert issubclass(SessionCollector, Collector) and issubclass(DemonstrationCollector, Collector)


def test_grpo_update_takes_the_steps_session_groups_and_drops_the_stale_ones():
    learner = _learner(max_off_policy_steps=1)
    before = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    groups = [_group(0, [1.0, 0.0, 1.0, 0.0]), _group(10, [0.0, 0.0, 0.0, 0.0])]
    stats = learner.update(Batch(data=groups, env_steps=8, episode_returns=[1.0, 0.0, 1.0, 0.0] + [0.0] * 4,
                                 iteration=1, version=0))
    assert stats["update_skipped"] == 0 and stats["samples"] == 4 and stats["step"] == 1
    assert stats["groups_used"] == 1 and stats["groups_no_signal"] == 1 and stats["reward_mean"] == 0.25
    assert "pg_loss" in stats and "policy_loss" not in stats
    after = learner.policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert learner.state_dict()["reward_range"] == [0.0, 1.0]
    # the same groups two versions later are stale (max_off_policy_steps 1): nothing trains, nothing is published
    stale = learner.update(Batch(data=[_group(20, [1.0, 0.0], version=0)], env_steps=2, iteration=2, version=2))
    assert stale["update_skipped"] == 1 and stale["samples"] == 0 and stale["groups_stale"] == 1


def test_grpo_state_dict_round_trips_the_policy_and_the_reward_range():
    a, b = _learner(), _learner()
    a.update(Batch(data=[_group(0, [1.0, 0.0, 1.0, 0.0])], env_steps=4, iteration=1, version=0))
    b.load_state_dict(a.state_dict())
    assert b.reward_range == a.reward_range == (0.0, 1.0)
    sa, sb = a.policy.model.state_dict(), b.policy.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_first_grpo_step_takes_its_kl_reference_from_the_policy_it_starts_from():
    """After a warm-up stage moved the weights, the KL term pulls toward those, not the engine's base."""
    learner = _learner(kl_coef=0.1)
    base = {k: v.clone() for k, v in learner.reference.state_dict().items()}
    with torch.no_grad():  # what a warm-up stage does to the policy
        for p in learner.policy.model.parameters():
            p.add_(0.01)
    warmed = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    learner.update(Batch(data=[_group(0, [1.0, 0.0, 1.0, 0.0])], env_steps=4, iteration=1, version=1))
    ref = learner.reference.state_dict()
    assert all(torch.equal(ref[k], warmed[k]) for k in ref) and any(not torch.equal(ref[k], base[k]) for k in ref)


def test_sft_is_a_learner_over_demonstration_batches():
    model, tok = build_tiny(0)
    policy = LLMPolicy(model, tok, None)
    kw = SFTKwargs(learning_rate=1e-2, epochs=3, batch_size=2)
    demos = [_sample(i, 0) for i in range(5)]
    assert sft_steps(len(demos), kw) == 9 == len(list(demonstration_batches(demos, kw)))
    assert sft_steps(len(demos), kw.model_copy(update={"max_steps": 4})) == 4
    learner = SFTLearner(policy, kw)
    collector = DemonstrationCollector(demonstration_batches(demos, kw))
    losses = [learner.update(collector.collect())["sft_loss"] for _ in range(9)]
    assert losses[-1] < losses[0]
    assert set(learner.state_dict()) == {"model", "optimizer"}


def test_the_agent_stack_has_no_untyped_config():
    """``cfg`` is an ``AgentRunConfig`` (or a ``RunConfig`` narrowed to one) in the agent stack, never ``Any``."""
    files = ["polar/trainers/agentic_run.py", "polar/rollout/sessions/collector.py", "polar/algorithms/grpo.py",
             "polar/algorithms/sft.py", "polar/rollout/sessions/stats.py", "polar/rollout/sessions/task_sampling.py"]
    untyped = [f"{f}:{n}" for f in files for n, line in enumerate((ROOT / f).read_text().splitlines(), 1)
               if re.search(r"\bcfg: Any\b", line)]
    assert not untyped, untyped
    assert not (ROOT / "polar/trainers/agent.py").exists() and not (ROOT / "polar/trainers/llm_trainer.py").exists()


def test_polar_run_composes_an_agent_run_as_the_one_loop_with_sft_as_its_first_stage(tmp_path):
    import sys

    from polar.config import load_config
    from polar.inference import load_engine
    from polar.trainers.build import build_trainer
    from polar.trainers.loop import TrainingLoop
    from polar.trainers.run_dir import RunDir
    from tests.agent_support.helpers import HERE, write_jsonl

    sys.path.insert(0, str(HERE))  # the harness/verifier module lives next to this test
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "prompt": f"Say something {i}."} for i in range(2)])
    write_jsonl(tmp_path / "demos.jsonl", [{"messages": [{"role": "user", "content": "Say something."},
                                                         {"role": "assistant", "content": "hello"}]}] * 3)
    (tmp_path / "run.yaml").write_text(f"""
harness: {{type: agent, callable: "agents_for_tests:one_token", timeout_s: 60}}
tasks: {tmp_path}/tasks.jsonl
verifier: {{type: "agents_for_tests:says_hello"}}
model: {{name_or_path: tiny}}
sft_warmup: {{demonstrations: {tmp_path}/demos.jsonl, kwargs: {{epochs: 2, batch_size: 2}}}}
policy: {{type: grpo, kwargs: {{group_size: 2, tasks_per_step: 1, total_steps: 3}}}}
""")
    cfg = load_config(tmp_path / "run.yaml")
    cfg._config_dir = HERE
    loop = build_trainer(cfg, RunDir.create("x", tmp_path / "run"), engine=load_engine("tiny"))
    try:
        assert type(loop) is TrainingLoop
        assert isinstance(loop.collector, SessionCollector) and isinstance(loop.learner, GRPOLearner)
        [stage] = loop.warm_up
        assert stage.name == "sft" and isinstance(stage.learner, SFTLearner)
        assert stage.learner.policy is loop.learner.policy  # one policy: the warm-up trains what GRPO starts from
        assert isinstance(stage.collector, DemonstrationCollector)
    finally:
        for closer in loop.close_after:
            closer.close()


def test_an_sft_run_without_demonstrations_fails_before_the_engine_starts_saying_what_it_needs(tmp_path):
    import pytest

    from polar.config import RunConfig, validate
    from polar.errors import ConfigError
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir

    cfg = validate(RunConfig, {"harness": {"type": "agent", "callable": "agents_for_tests:one_token"},
                               "model": {"name_or_path": "tiny"}, "policy": {"type": "sft"}})

    class NoEngine:  # the check comes first: a stack built from this would fail differently
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the engine was used ({name}) before the config was checked")

    with pytest.raises(ConfigError, match=r"policy sft needs 'tasks: FILE.jsonl' \(the demonstrations"):
        build_trainer(cfg, RunDir.create("x", tmp_path / "run"), engine=NoEngine())
