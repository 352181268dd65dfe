"""``distribution.num_learners``: N learner processes (Ray actors, one gloo process group) split one batch and take the
step one learner takes on the whole batch; a dead learner restarts the group from the last checkpoint."""

from __future__ import annotations

import copy
import operator
import os
import signal
import time
from functools import partial
from typing import Any

import pytest
import torch

from polar.algorithms.appo import APPOLearner
from polar.algorithms.grpo import GRPOLearner, has_signal
from polar.algorithms.ppo import PPOLearner
from polar.algorithms.sft import SFTLearner
from polar.config import RunConfig, validate
from polar.config.grpo import GRPOKwargs, SFTKwargs
from polar.errors import ConfigError, DistributedError
from polar.inference.tiny import build_tiny
from polar.models.llm_policy import LLMPolicy
from polar.trainers.learner_group import GroupSpec, LearnerGroup, shard_groups, shard_rollout, shard_samples
from polar.trainers.loop import Stage, TrainingLoop, iterations_budget
from polar.trainers.run_dir import RunDir
from polar.types import Batch, NoEvaluation, Rollout, SessionResult, SessionStatus, TrajectorySample
from tests.algorithms.ppo_support import one_rollout, rollout_batch

# float32 forward/backward summed in a different order on each shard, then averaged in float64. Adam divides by
# sqrt(v): where a gradient is near its eps (1e-8) that rounding moves a parameter by a visible part of lr, so the
# tolerance is 1% of one Adam step (lr * 1e-2). A wrong weighting (by learner instead of by token/sample) flips
# gradient signs and moves parameters by about lr: far outside it.
PPO_LR = 3e-4
GRPO_LR = 1e-2

CARTPOLE = {"harness": {"type": "gymnasium", "id": "CartPole-v1"},
            "policy": {"type": "ppo", "kwargs": {"n_epochs": 2, "num_minibatches": 1, "normalize_advantage": False}}}


@pytest.fixture(scope="module")
def ppo_rollout():
    cfg = validate(RunConfig, CARTPOLE)
    policy, frag = one_rollout(cfg)
    return cfg, policy.agent, frag


def _ppo_batch(frag) -> Batch[Rollout]:
    return rollout_batch(frag, first_iteration=True)


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], lr: float, share: float = 1e-2) -> float:
    worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert worst <= share * lr, f"largest parameter difference {worst:.3g} > {share:.0%} of lr {lr:g}"
    return worst


def test_two_ppo_learners_take_the_step_one_learner_takes_on_the_same_batch(ray_cluster, ppo_rollout):
    cfg, agent, frag = ppo_rollout
    kw, total = cfg.policy.kwargs, cfg.total_env_steps
    start = _params(agent)
    one = PPOLearner(copy.deepcopy(agent), kw, total)
    one.update(_ppo_batch(frag))
    local = PPOLearner(copy.deepcopy(agent), kw, total)
    group = LearnerGroup(local, partial(PPOLearner, copy.deepcopy(agent), kw, total), operator.attrgetter("agent"),
                         shard_rollout, GroupSpec(num_learners=2))
    try:
        group.update(_ppo_batch(frag))
    finally:
        group.close()
    moved = max(float((one.agent.state_dict()[k] - start[k]).abs().max()) for k in start)
    assert moved > 0.5 * PPO_LR  # the step is far larger than the tolerance
    _assert_same(_params(one.agent), _params(local.agent), PPO_LR)


def _sample(i: int, length: int) -> TrajectorySample:
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(3, 200, (length,), generator=g).tolist()
    return TrajectorySample(session_id=f"s{i}", token_ids=ids, loss_mask=[0] * 4 + [1] * (length - 4),
                            logprobs=[-5.0] * length, policy_versions=[0] * length, call_indices=[0] * length,
                            metadata={"min_policy_version": 0})


def _groups() -> list[list[SessionResult]]:
    """Four groups with signal; sequences of different lengths, so a shard's token count differs from its share of
    sequences (the averaging must weight by tokens, not by learners)."""
    out = []
    for g in range(4):
        rewards = [1.0, 0.0, 0.5, float(g % 2)]
        out.append([SessionResult(session_id=f"s{g}-{i}", task_id=f"t{g}", group_id=f"g{g}", sample_index=i,
                                  status=SessionStatus.DONE, reward=r,
                                  samples=[_sample(10 * g + i, 6 + 3 * g + i)]) for i, r in enumerate(rewards)])
    return out


def _grpo_learner(seed: int = 0) -> GRPOLearner:
    model, tok = build_tiny(seed)
    return GRPOLearner(LLMPolicy(model, tok, None), GRPOKwargs(micro_batch_size=4, learning_rate=GRPO_LR))


def test_two_grpo_learners_take_the_step_one_learner_takes_on_the_same_groups(ray_cluster):
    """Step 1: four groups with signal, two per rank. Step 2 (one group start for both, which costs tens of
    seconds): one group carries signal and one ties, so the rank dealt the tied group has no usable sample; it
    joins the step's all-reduce with weight 0 and applies the group's gradient, so the step completes at once
    (it used to wait in the collective until the timeout, then restart the group) and still equals one
    learner's step."""
    import ray

    groups = _groups()
    batch = Batch(data=groups, env_steps=16, iteration=1, version=0)
    one = _grpo_learner()
    start = _params(one.policy.model)
    one.update(batch)
    local = _grpo_learner()
    group = LearnerGroup(local, _grpo_learner, operator.attrgetter("policy.model"), partial(shard_groups, signal=has_signal),
                         GroupSpec(num_learners=2, max_restarts=0))  # a hung collective fails the test, not retried
    tied = [SessionResult(session_id=f"t-{i}", task_id="t", group_id="tied", sample_index=i, status=SessionStatus.DONE,
                          reward=1.0, samples=[_sample(90 + i, 8)]) for i in range(4)]
    second = Batch(data=[groups[1], tied], env_steps=8, iteration=2, version=1)
    assert [has_signal(shard_groups(second, r, 2, signal=has_signal).data[0]) for r in (0, 1)] == [True, False]
    try:
        stats = group.update(batch)
        assert stats["samples"] == 8  # rank 0 trained on its half of the groups
        moved = max(float((one.policy.model.state_dict()[k] - start[k]).abs().max()) for k in start)
        assert moved > 0.5 * GRPO_LR
        _assert_same(_params(one.policy.model), _params(local.policy.model), GRPO_LR)

        one.update(second)
        stats = group.update(second)
        empty_rank = ray.get(group.ranks[1].module_state.remote())  # the rank dealt the tied group
    finally:
        group.close()
    assert stats["learner_group_restarts"] == 0 and stats["update_skipped"] == 0
    _assert_same(_params(one.policy.model), _params(local.policy.model), GRPO_LR)
    _assert_same(_params(local.policy.model), dict(empty_rank), GRPO_LR)  # it stepped with its peer


def _gone(pids: list[int], timeout_s: float = 60.0) -> list[int]:
    """The processes of ``pids`` still running after ``timeout_s`` (a killed Ray actor exits in well under that)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def _assert_ranks_ended(pids: list[int]) -> None:
    """No learner process is left: the ranks' processes exited and the cluster has all its CPUs back."""
    import ray

    assert pids and _gone(pids) == [], f"learner rank processes still running: {_gone(pids, 0)}"
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources()["CPU"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU", 0.0) == ray.cluster_resources()["CPU"]


class _Batches:
    """A collector of given batches, so the group and the one-learner reference train on the same data; it
    records the ranks' process ids when the loop publishes (after an update, while they run)."""

    def __init__(self, batches: list[Batch[Any]], group: LearnerGroup[Any] | None = None) -> None:
        self.batches = batches
        self.group = group
        self.pids: list[int] = []

    def start(self, weights: Any, version: int) -> None:
        pass

    def collect(self) -> Batch[Any]:
        return self.batches.pop(0)

    def publish(self, weights: Any, version: int) -> None:
        import ray

        if self.group is not None:
            self.pids.extend(ray.get([r.pid.remote() for r in self.group.ranks]))

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any) -> None:
        pass


def test_a_grpo_group_built_before_the_sft_warm_up_starts_from_the_warmed_weights(ray_cluster, tmp_path):
    """As ``registry.grpo_parts`` composes GRPO with ``sft_warmup`` and ``num_learners: 2``: the group is built
    before the warm-up stage trains the policy they share. Its ranks start at first use, from the warmed weights,
    so the run's first GRPO step is the one learner's after the same warm-up (they used to start when the group
    was built, and rank 0's first step then overwrote the warm-up). When the run ends the loop ends the ranks:
    their processes exit and the cluster has its CPUs back."""
    demos = Batch(data=[_sample(50 + i, 10 + 2 * i) for i in range(4)], env_steps=0)
    sft_kw = SFTKwargs(learning_rate=GRPO_LR, batch_size=4)
    grpo_batch = Batch(data=_groups(), env_steps=16)
    ref = _grpo_learner()  # one learner: the warm-up, then the step
    start = _params(ref.policy.model)
    SFTLearner(ref.policy, sft_kw).update(demos)
    warm_moved = max(float((ref.policy.model.state_dict()[k] - start[k]).abs().max()) for k in start)
    assert warm_moved > 0.5 * GRPO_LR  # the warm-up moves the weights far beyond the tolerance
    ref.update(grpo_batch)

    local = _grpo_learner()
    group = LearnerGroup(local, _grpo_learner, operator.attrgetter("policy.model"),
                         partial(shard_groups, signal=has_signal), GroupSpec(num_learners=2, max_restarts=0))
    collector = _Batches([grpo_batch], group)
    warm_up = Stage("sft", _Batches([demos]), SFTLearner(local.policy, sft_kw), budget=iterations_budget(1))
    cfg = validate(RunConfig, {**CARTPOLE, "logging": {"tensorboard": False, "checkpoint_freq": 0,
                                                       "progress_bar": False}, "eval": {"at_end": False}})
    loop = TrainingLoop(cfg, RunDir.create("warm", tmp_path / "run"), collector, group, NoEvaluation(),
                        budget=iterations_budget(1), warm_up=[warm_up])
    try:
        result = loop.train()
        assert result["iterations"] == 1 and result["sft"]["updates"] == 1
        # what this tells apart: ranks started from the pre-warm-up weights end 3 x lr away (measured on main);
        # from the warmed ones, within float32 order noise, which Adam's first step after a warm-up amplified to
        # 1.1% of lr once (near-zero gradients), so the bound is 10% of one Adam step, not the 1% of the step tests
        _assert_same(_params(ref.policy.model), _params(local.policy.model), GRPO_LR, share=0.1)
        _assert_ranks_ended(collector.pids)  # the loop ended them
    finally:
        group.close()


def _sft_learner(seed: int = 0) -> SFTLearner:
    model, tok = build_tiny(seed)
    return SFTLearner(LLMPolicy(model, tok, None), SFTKwargs(learning_rate=GRPO_LR, batch_size=5))


def test_two_sft_learners_take_the_step_one_learner_takes_on_the_same_minibatch(ray_cluster):
    """Five demonstrations of different lengths, dealt round-robin (rank 0 gets 3 with 36 target tokens, rank 1
    gets 2 with 24): each rank's gradient is weighted by its target tokens, so the group takes one learner's
    token-mean step (a per-rank mean would weight them 1:1). The second minibatch has one demonstration: rank 1
    has none and steps with weight 0 (no hang, same weights)."""
    import ray

    first = Batch(data=[_sample(i, 6 + 5 * i) for i in range(5)], env_steps=0)
    second = Batch(data=[_sample(7, 12)], env_steps=0)
    assert shard_samples(second, 1, 2).data == []
    one = _sft_learner()
    start = _params(one.policy.model)
    one.update(first)
    local = _sft_learner()
    group = LearnerGroup(local, _sft_learner, operator.attrgetter("policy.model"), shard_samples,
                         GroupSpec(num_learners=2, max_restarts=0))
    try:
        group.update(first)
        moved = max(float((one.policy.model.state_dict()[k] - start[k]).abs().max()) for k in start)
        assert moved > 0.5 * GRPO_LR
        _assert_same(_params(one.policy.model), _params(local.policy.model), GRPO_LR)
        one.update(second)
        stats = group.update(second)
        empty_rank = ray.get(group.ranks[1].module_state.remote())
        pids = ray.get([r.pid.remote() for r in group.ranks])
    finally:
        group.close()
    _assert_ranks_ended(pids)
    # an SFT run checkpoints after its stage closed the group: rank 0's state, kept at close, no ranks started
    state = group.state_dict()
    assert group.ranks == [] and state["optimizer"]["state"]  # Adam's moments: rank 0 stepped twice
    _assert_same(_params(local.policy.model), state["model"], GRPO_LR)
    assert stats["learner_group_restarts"] == 0
    _assert_same(_params(one.policy.model), _params(local.policy.model), GRPO_LR)
    _assert_same(_params(local.policy.model), dict(empty_rank), GRPO_LR)


APPO_CARTPOLE = {"harness": {"type": "gymnasium", "id": "CartPole-v1"},  # one minibatch: the whole fragment
                 "policy": {"type": "appo", "kwargs": {"n_epochs": 2, "batch_size": 0, "normalize_advantage": False}}}


def test_two_appo_learners_take_the_step_one_learner_takes_on_the_same_fragment(ray_cluster):
    """One fragment, its env columns split over two ranks, V-trace per column, the gradient weighted by samples."""
    cfg = validate(RunConfig, APPO_CARTPOLE)
    policy, frag = one_rollout(cfg)
    kw = cfg.policy.kwargs
    start = _params(policy.agent)
    one = APPOLearner(copy.deepcopy(policy.agent), kw)
    one.update(_ppo_batch(frag))
    local = APPOLearner(copy.deepcopy(policy.agent), kw)
    group = LearnerGroup(local, partial(APPOLearner, copy.deepcopy(policy.agent), kw), operator.attrgetter("agent"),
                         shard_rollout, GroupSpec(num_learners=2, max_restarts=0))
    try:
        stats = group.update(_ppo_batch(frag))
    finally:
        group.close()
    assert stats["n_updates"] == 2 and stats["update_skipped"] == 0
    moved = max(float((one.agent.state_dict()[k] - start[k]).abs().max()) for k in start)
    assert moved > 0.5 * kw.learning_rate
    _assert_same(_params(one.agent), _params(local.agent), kw.learning_rate)


def test_an_appo_rank_takes_one_all_reduce_per_minibatch_of_the_whole_fragment():
    """With minibatches (``batch_size`` 64 of a 512-sample fragment), every rank joins 8 all-reduces per epoch, as
    many as one learner takes steps on the whole fragment, each with its share of the minibatch as its weight:
    counted from its own half, a rank would join 4 and its peer would wait in the 5th."""
    cfg = validate(RunConfig, {**APPO_CARTPOLE, "policy": {"type": "appo", "kwargs": {"n_epochs": 2, "batch_size": 64}}})
    policy, frag = one_rollout(cfg)
    batch = _ppo_batch(frag)
    assert batch.env_steps == 512
    learner = APPOLearner(copy.deepcopy(policy.agent), cfg.policy.kwargs)
    weights: list[float] = []
    learner.grad_sync = lambda params, weight: (weights.append(weight), 2 * weight)[1]
    stats = learner.update(shard_rollout(batch, 1, 2))
    assert weights == [32.0] * 16 and stats["n_updates"] == 16


def test_a_killed_learner_restarts_the_group_from_the_last_checkpoint(ray_cluster, ppo_rollout):
    import ray

    cfg, agent, frag = ppo_rollout
    kw, total = cfg.policy.kwargs, cfg.total_env_steps
    local = PPOLearner(copy.deepcopy(agent), kw, total)
    group = LearnerGroup(local, partial(PPOLearner, copy.deepcopy(agent), kw, total), operator.attrgetter("agent"),
                         shard_rollout, GroupSpec(num_learners=2, collective_timeout_s=20, update_timeout_s=60))
    try:
        group.update(_ppo_batch(frag))
        checkpoint = group.state_dict()
        at_checkpoint = _params(local.agent)
        # the same run, one learner, from the checkpoint: what the restarted group must reproduce
        ref = PPOLearner(copy.deepcopy(local.agent), kw, total)
        ref.load_state_dict(copy.deepcopy(checkpoint))
        ref.update(_ppo_batch(frag))
        group.update(_ppo_batch(frag))  # a step past the checkpoint, lost when the group restarts
        pid = ray.get(group.ranks[1].pid.remote())
        os.kill(pid, signal.SIGKILL)
        stats = group.update(_ppo_batch(frag))
        assert stats["learner_group_restarts"] == 1
    finally:
        group.close()
    assert any(not torch.equal(at_checkpoint[k], local.agent.state_dict()[k]) for k in at_checkpoint)
    _assert_same(_params(ref.agent), _params(local.agent), PPO_LR)


def test_more_learners_than_the_cluster_has_fail_at_start_naming_the_key(ray_cluster, ppo_rollout):
    cfg, agent, _ = ppo_rollout
    kw, total = cfg.policy.kwargs, cfg.total_env_steps
    with pytest.raises(DistributedError, match=r"distribution\.num_learners"):
        LearnerGroup(PPOLearner(copy.deepcopy(agent), kw, total),
                     partial(PPOLearner, copy.deepcopy(agent), kw, total), operator.attrgetter("agent"),
                     shard_rollout, GroupSpec(num_learners=64))


def test_num_learners_and_learner_sharding_are_checked_at_validation():
    base = {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"}}
    with pytest.raises(ConfigError, match=r"distribution\.num_learners.*backend: ray"):
        validate(RunConfig, {**base, "distribution": {"num_learners": 2}})
    with pytest.raises(ConfigError, match=r"distribution\.learner_sharding"):
        validate(RunConfig, {**base, "distribution": {"backend": "ray", "num_learners": 2,
                                                       "learner_sharding": "fsdp"}})
    with pytest.raises(ConfigError, match=r"distribution\.num_learners: 2 is honoured by PPO .* policy dqn"):
        validate(RunConfig, {**base, "policy": {"type": "dqn"}, "distribution": {"backend": "ray", "num_learners": 2}})
    cfg = validate(RunConfig, {**base, "distribution": {"backend": "ray", "num_learners": 2}})
    assert cfg.distribution.num_learners == 2
    cfg = validate(RunConfig, {**base, "policy": {"type": "appo"}, "distribution": {"backend": "ray", "num_learners": 2}})
    assert cfg.distribution.num_learners == 2


@pytest.mark.parametrize("policy, distribution, message", [
    ("dqn", {}, r"distribution\.num_learners: 2 is honoured by PPO and APPO \(env runs\), GRPO and SFT \(agent runs\); "
                r"policy dqn trains on one learner: set num_learners: 1"),
    # each rank needs env columns: an APPO batch is one worker's fragment, a PPO batch all workers' fragments
    ("appo", {"rollout_workers": 4, "envs_per_worker": 1},
     r"distribution\.num_learners: 2 learners each train on their own env columns of a batch, but each APPO batch "
     r"has 1 \(envs_per_worker 1\); raise distribution\.envs_per_worker or lower num_learners"),
    ("ppo", {"num_learners": 3, "rollout_workers": 1, "envs_per_worker": 2}, r"but each PPO batch has 2 "),
    ("ppo", {"num_gpus": 1}, r"distribution\.num_gpus: 1 with num_learners: 2, but a learner group's ranks train on "
                             r"CPU \(gloo\) in this version; set it to 0 or num_learners: 1"),
    ("ppo", {"learner_resources": {"num_gpus": 0.5}}, r"distribution\.learner_resources\.num_gpus: 0\.5 with"),
    ({"type": "appo", "kwargs": {"intrinsic": {}}}, {},
     r"policy\.kwargs\.intrinsic needs distribution\.num_learners: 1 \(the reward module is not shared"),
])
def test_a_learner_group_it_cannot_run_is_refused_in_one_line_naming_the_key(policy, distribution, message):
    cfg = {"harness": {"type": "gymnasium", "id": "CartPole-v1"},
           "policy": policy if isinstance(policy, dict) else {"type": policy},
           "distribution": {"backend": "ray", "num_learners": 2, "rollout_workers": 2, **distribution}}
    with pytest.raises(ConfigError, match=message) as e:
        validate(RunConfig, cfg)
    assert "\n" not in str(e.value) and "got {" not in str(e.value)  # one line, no config echoed
    ok = {**cfg, "policy": {"type": "ppo"}, "distribution": {"backend": "ray", "num_learners": 2, "rollout_workers": 2}}
    assert validate(RunConfig, ok).distribution.num_learners == 2


PPO_ZOO = {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0,
           "learning_rate": 1e-3, "lr_schedule": "linear", "clip_range_schedule": "linear"}


@pytest.mark.slow
@pytest.mark.ray
def test_ppo_with_two_learners_reaches_475_on_cartpole(ray_cluster, tmp_path):
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir

    cfg = validate(RunConfig, {
        "name": "two-learners", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "policy": {"type": "ppo", "kwargs": PPO_ZOO},
        "distribution": {"backend": "ray", "coordinator_address": ray_cluster.address, "rollout_workers": 1,
                         "envs_per_worker": 8, "num_learners": 2},
        "total_env_steps": 300_000, "stop_reward": 475,
        "logging": {"checkpoint_freq": 0, "tensorboard": False, "progress_bar": False},
        "eval": {"episodes": 5, "num_envs": 5}})
    rows: list[dict] = []
    result = build_trainer(cfg, RunDir.create("ppo2", tmp_path / "run"), on_iteration=rows.append).train()
    assert result["stopped_early"] and result["episode_reward_mean"] >= 475, result
    assert any("learner_group_restarts" in k for r in rows for k in r), sorted(rows[-1])



@pytest.mark.slow  # a Ray learner actor, two learner ranks and a gateway node of the tiny model: minutes on 2 cores
def test_grpo_with_two_learners_learns_the_tiny_model_task(ray_cluster, tmp_path):
    """The default suite's tiny-model task (tests/trainers/test_agent_learning.py: SFT teaches "done" or "hello",
    the verifier rewards "hello", GRPO must move the choice), with ``num_learners: 2`` on Ray."""
    import json

    from polar.config import load_config
    from polar.metrics.logger import read_metrics
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir
    from tests.agent_support.helpers import HERE, write_jsonl

    write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "prompt": f"Say something {i}."} for i in range(4)])
    write_jsonl(tmp_path / "demos.jsonl", [{"messages": [{"role": "user", "content": "Say something."},
                                                         {"role": "assistant", "content": ["done", "hello"][i % 2]}]}
                                           for i in range(8)])
    (tmp_path / "run.yaml").write_text(f"""
name: trivial-2-learners
harness: {{type: agent, callable: "agents_for_tests:one_token", timeout_s: 120}}
tasks: {tmp_path / 'tasks.jsonl'}
eval_tasks: {tmp_path / 'tasks.jsonl'}
verifier: {{type: "agents_for_tests:says_hello"}}
model: {{name_or_path: tiny}}
sessions: {{max_run_workers: 64}}
sft_warmup: {{demonstrations: {tmp_path / 'demos.jsonl'}, kwargs: {{learning_rate: 1.0e-2, epochs: 20, max_steps: 20,
             batch_size: 4}}}}
policy:
  type: grpo
  kwargs: {{group_size: 6, tasks_per_step: 4, total_steps: 6, learning_rate: 5.0e-2, micro_batch_size: 24,
           max_off_policy_steps: 1, eval_samples: 12, kl_coef: 0.01}}
distribution: {{backend: ray, coordinator_address: "{ray_cluster.address}", num_learners: 2,
               learner_resources: {{num_cpus: 0.5}}, gateway_resources: {{num_cpus: 0.5}}, learner_timeout_s: 300}}
logging: {{checkpoint_freq: 3, tensorboard: false, progress_bar: false}}
""")
    cfg = load_config(tmp_path / "run.yaml")
    cfg._config_dir = HERE
    run_dir = RunDir.create("trivial2", tmp_path / "run")
    rows: list[dict] = []
    summary = build_trainer(cfg, run_dir, on_iteration=rows.append).train()
    metrics = [r for r in read_metrics(run_dir.metrics_path) if "reward_mean" in r]
    assert len(metrics) == 6 and all(r["sessions_error"] == 0 for r in metrics)
    assert any("learner_group_restarts" in k for r in rows for k in r), sorted(rows[-1])
    final = json.loads((run_dir.path / "eval" / "summary.json").read_text())
    before, after = final["eval_before"]["success"], final["eval_after"]["success"]
    assert after >= before + 0.2, (before, after, [r["reward_mean"] for r in metrics], summary)
    assert metrics[-1]["reward_mean"] > metrics[0]["reward_mean"]
    print(f"two learners: held-out success {before:.2f} -> {after:.2f}; step rewards "
          f"{[round(r['reward_mean'], 2) for r in metrics]}")
