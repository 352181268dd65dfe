"""Partial rollouts (``policy.kwargs.partial_rollouts``) on the tiny model and the embedded engine: a generation goes
on across a weight update, each token recorded with the version that sampled it and that version's logprob; a
session spanning a sync has tokens of two versions, and the learner's ratio is taken per token against each
token's own logprob; a group more than ``max_off_policy_steps`` versions old is never handed to the learner; the
key takes effect in a real run; bad settings fail in one line naming the key."""

import asyncio
import sys
import time

import pytest
import torch

from polar.algorithms.grpo import token_logprobs
from polar.config import load_config
from polar.errors import ConfigError
from polar.inference import load_engine
from polar.inference.base import GenerationRequest
from polar.metrics.logger import read_metrics
from polar.models.llm_policy import LLMPolicy
from polar.rollout.sessions.collector import SessionCollector
from polar.rollout.sessions.partial import PartialRollouts
from polar.trainers.agentic_run import build_stack
from polar.trainers.build import train_agentic
from polar.trainers.run_dir import RunDir
from tests.agent_support.helpers import HERE, write_jsonl

CONFIG = """
name: partial
harness: {type: agent, callable: "agents_for_tests:ask_once", timeout_s: 120}
tasks: tasks.jsonl
verifier: {type: "rewards_for_tests:by_kind"}
model: {name_or_path: tiny}
policy:
  type: grpo
  kwargs: {group_size: 2, tasks_per_step: 1, total_steps: 3, learning_rate: 1.0e-3, micro_batch_size: 16,
           max_tokens: MAX_TOKENS, max_off_policy_steps: 1, dynamic_sampling: {max_extra_rounds: 0}, EXTRA}
logging: {checkpoint_freq: 0, tensorboard: false}
"""


def _config(tmp_path, extra: str = "partial_rollouts: {}", max_tokens: int = 120, overrides: list[str] | None = None):
    sys.path.insert(0, str(HERE))  # the harness and verifier modules live next to the tests
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "kind": "mixed", "prompt": f"Count to {i}."}
                                           for i in range(6)])
    path = tmp_path / "run.yaml"
    path.write_text(CONFIG.replace("EXTRA", extra).replace("MAX_TOKENS", str(max_tokens)))
    cfg = load_config(path, overrides or [])
    cfg = cfg.model_copy(update={"tasks": str(tmp_path / "tasks.jsonl")})
    cfg._config_dir = HERE
    return cfg


def _perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def _scored(model: torch.nn.Module, state: dict[str, torch.Tensor], ids: list[int]) -> list[float]:
    """Each token's logprob under ``state`` given everything before it (teacher forcing)."""
    model.load_state_dict(state)
    with torch.no_grad():
        t = torch.tensor([ids])
        return token_logprobs(model(input_ids=t).logits, t)[0].tolist()


def _wait_for_a_generation(engine, min_tokens: int = 3, timeout_s: float = 60.0) -> None:
    """Until the embedded engine has a sequence under way that sampled ``min_tokens`` and is not done."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(s.n_generated >= min_tokens and not s.done for s in [*engine._active, *engine._solo]):
            return
        time.sleep(0.005)
    raise AssertionError("no generation got under way")


def test_a_generation_goes_on_across_a_weight_update_each_token_scored_by_the_weights_that_sampled_it():
    engine = load_engine("tiny")
    model = engine.model
    old = {k: v.clone() for k, v in model.state_dict().items()}
    new = _perturbed(model, 1)
    # 400 tokens: the engine thread decodes ahead of this consumer, so a 40-token generation could end before
    # the update below reached it (seen under two pytest workers); with 390 more to go the update lands mid-way
    request = GenerationRequest(prompt_ids=list(range(5, 25)), max_tokens=400, temperature=1.0, stop_token_ids=[],
                                seed=1)

    async def generate() -> tuple[list[int], list[float], list[int], str | None]:
        ids, lps, versions, finish = [], [], [], None
        async for ev in engine.generate(request):
            ids.append(ev.token_id)
            lps.append(ev.logprob)
            versions.append(ev.policy_version)
            finish = ev.finish_reason
            if len(ids) == 10:
                await engine.update_weights_in_flight(new, 1)
        return ids, lps, versions, finish

    ids, lps, versions, finish = asyncio.run(generate())
    assert finish == "length" and len(ids) == 400  # not aborted: it went on under the new weights
    assert versions[:10] == [0] * 10 and versions[-1] == 1 and versions == sorted(versions)
    for state, version in ((old, 0), (new, 1)):
        scored = _scored(model, state, request.prompt_ids + ids)[len(request.prompt_ids):]
        mine = [i for i, v in enumerate(versions) if v == version]
        assert max(abs(scored[i] - lps[i]) for i in mine) < 1e-4, version
        assert mine  # both versions sampled some tokens


def _stack(tmp_path, cfg):
    engine = load_engine("tiny")
    engine.default_stop_token_ids = []  # every call samples its max_tokens: it is surely under way at the sync
    return build_stack(cfg, tmp_path / "run", engine=engine, training=True).start(), engine


def test_a_session_spanning_a_sync_records_tokens_of_two_versions_and_the_ratio_is_taken_per_token(tmp_path):
    cfg = _config(tmp_path)
    assert cfg.gateway.sync.in_flight == "continue"  # what partial_rollouts resolves it to
    stack, engine = _stack(tmp_path, cfg)
    collector = SessionCollector(stack, [{"id": "t0", "kind": "mixed", "prompt": "Count."}], 1, 2, 0, batches=1,
                                 prefetch=False, partial=PartialRollouts(max_staleness=1, max_groups_in_flight=1))
    model = engine.model
    old = {k: v.clone() for k, v in model.state_dict().items()}
    new = _perturbed(model, 2)
    try:
        collector.start(old, 0)
        _wait_for_a_generation(engine)
        collector.publish(new, 1)  # the group is under way: it goes on under version 1
        batch = collector.collect()
    finally:
        collector.close()
        stack.stop()
    [group] = batch.data
    samples = [s for r in group for s in r.samples]
    trained = [(v, lp, i) for s in samples for i, (v, lp, m) in enumerate(zip(s.policy_versions, s.logprobs,
                                                                              s.loss_mask, strict=True)) if m]
    assert {v for v, _, _ in trained} == {0, 1}  # a session that spans the sync: tokens of both versions
    assert collector.metrics()["partial/sessions_spanning_update"] >= 1
    assert batch.policy_versions and min(batch.policy_versions) == 0  # the loop's policy_lag sees the oldest
    # the learner's ratio, token by token, against the logprob the token's own version recorded: under version 1
    # (the learner's weights now) it is exactly 1 on the tokens version 1 sampled, and not on version 0's
    model.load_state_dict(new)
    policy = LLMPolicy(model, engine.tokenizer, None)
    for s in samples:
        batch_t = policy.collate([s])
        assert torch.allclose(batch_t.old_logprobs[0, :len(s.logprobs)], torch.tensor(s.logprobs))
        with torch.no_grad():
            log_ratio = (policy.token_logprobs(batch_t) - batch_t.old_logprobs)[0, :len(s.logprobs)]
        for i, (v, m) in enumerate(zip(s.policy_versions, s.loss_mask, strict=True)):
            if m and v == 1:
                assert abs(float(log_ratio[i])) < 1e-4
        old_ones = [abs(float(log_ratio[i])) for i, (v, m) in enumerate(zip(s.policy_versions, s.loss_mask,
                                                                            strict=True)) if m and v == 0]
        assert not old_ones or max(old_ones) > 1e-3


def test_a_group_more_than_k_versions_old_is_dropped_and_a_fresher_one_is_trained(tmp_path):
    cfg = _config(tmp_path)
    stack, engine = _stack(tmp_path, cfg)
    tasks = [{"id": f"t{i}", "kind": "mixed", "prompt": f"Count {i}."} for i in range(4)]
    collector = SessionCollector(stack, tasks, 1, 2, 0, batches=1, prefetch=False,
                                 partial=PartialRollouts(max_staleness=1, max_groups_in_flight=1))
    model = engine.model
    try:
        collector.start(model.state_dict(), 0)
        _wait_for_a_generation(engine)
        collector.publish(_perturbed(model, 3), 1)
        collector.publish(_perturbed(model, 4), 2)  # the group under way now has tokens of version 0: 2 behind
        batch = collector.collect()
    finally:
        collector.close()
        stack.stop()
    metrics = collector.metrics()
    assert metrics["partial/groups_stale"] >= 1  # the stale group was not handed to the learner
    [group] = batch.data
    versions = {v for r in group for s in r.samples for v, m in zip(s.policy_versions, s.loss_mask, strict=True) if m}
    assert versions and min(versions) >= 1  # what the learner got is within K = 1 of version 2


def test_partial_rollouts_take_effect_in_a_run(tmp_path):
    """The key switches the collector to groups that run across updates (its metrics) and the gateway to
    in-flight weight updates, and the run trains its steps; without it the run is one-step-off as before."""
    cfg = _config(tmp_path, max_tokens=16)
    run_dir = RunDir.create("partial", tmp_path / "run")
    summary = train_agentic(cfg, run_dir, engine=load_engine("tiny"))
    rows = [r for r in read_metrics(run_dir.metrics_path) if "reward_mean" in r]
    assert len(rows) == 3 and summary["iterations"] == 3
    assert all("partial/groups_stale" in r and "policy_lag" in r for r in rows)
    assert all(r["policy_lag"] <= 1 for r in rows)  # max_off_policy_steps 1
    assert "in_flight: continue" in (run_dir.path / "config.resolved.yaml").read_text()
    off = tmp_path / "off"
    off.mkdir()
    cfg = _config(off, extra="eval_samples: 1", max_tokens=16)
    run_dir = RunDir.create("one-step-off", off / "run")
    train_agentic(cfg, run_dir, engine=load_engine("tiny"))
    rows = [r for r in read_metrics(run_dir.metrics_path) if "reward_mean" in r]
    assert len(rows) == 3 and not any("partial/groups_stale" in r for r in rows)


@pytest.mark.parametrize(("extra", "overrides", "message"), [
    ("partial_rollouts: {}", ["policy.kwargs.max_off_policy_steps=-1"], "max_off_policy_steps"),
    ("partial_rollouts: {}", ["policy.kwargs.max_off_policy_steps=0"],
     "partial_rollouts: sessions span weight updates, so a token can be a version behind the learner; set "
     "max_off_policy_steps >= 1"),
    ("partial_rollouts: {max_groups_in_flight: 1}", ["policy.kwargs.tasks_per_step=2"],
     "partial_rollouts.max_groups_in_flight 1 is below tasks_per_step 2"),
    ("partial_rollouts: {}", ["model.engine=vllm"], "policy.kwargs.partial_rollouts: model.engine 'vllm' cannot"),
    ("partial_rollouts: {}", ["model.name_or_path=vllm:http://127.0.0.1:9"],
     "policy.kwargs.partial_rollouts: model.name_or_path 'vllm' cannot"),
    ("partial_rollouts: {}", ["gateway.sync.in_flight=finish"],
     "gateway.sync.in_flight is 'finish'; set it to continue"),
])
def test_bad_partial_rollout_settings_fail_in_one_line_naming_the_key(tmp_path, extra, overrides, message):
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, extra=extra, overrides=overrides)
    assert message in str(e.value) and "\n" not in str(e.value).strip(), str(e.value)


def test_partial_rollouts_true_is_the_defaults():
    from polar.config.grpo import GRPOKwargs

    assert GRPOKwargs(partial_rollouts=True).partial_rollouts is not None
    assert GRPOKwargs(partial_rollouts=False).partial_rollouts is None


def test_a_gateway_asked_to_continue_calls_across_a_sync_with_an_engine_that_cannot_fails_naming_the_key():
    from polar.config.gateway import GatewayConfig
    from polar.gateway import GatewayServer
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer

    engine = ScriptedEngine(build_tiny_tokenizer(), lambda req: "hi")
    with pytest.raises(ConfigError, match=r"^gateway.sync.in_flight: continue .* the ScriptedEngine cannot"):
        GatewayServer(GatewayConfig(sync={"in_flight": "continue"}), engine=engine)


class _Stack:
    """A rollout stack whose groups end when the test says so (``finish``): the collector's bookkeeping alone.
    Each group's one session sampled one token under the version it was submitted at."""

    def __init__(self) -> None:
        import threading

        self.engine = type("Engine", (), {"policy_version": 0})()
        self.submitted: list[tuple[str, int]] = []  # (task id, version at submission)
        self._lock = threading.Lock()
        self._done: dict[str, threading.Event] = {}

    def run_groups(self, groups, timeout_s=None):
        import threading

        from polar.types import SessionResult, SessionStatus, TrajectorySample

        [(task, n, _meta)] = groups
        with self._lock:
            version = int(self.engine.policy_version)
            key = f"{task['id']}#{len(self.submitted)}"
            self.submitted.append((key, version))
            event = self._done.setdefault(key, threading.Event())
        event.wait(60)
        sample = TrajectorySample(session_id=key, token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0],
                                  policy_versions=[version] * 2, call_indices=[0, 0],
                                  metadata={"min_policy_version": version})
        return [[SessionResult(session_id=f"{key}/{i}", task_id=task["id"], group_id=key, sample_index=i,
                               status=SessionStatus.DONE, reward=float(i), samples=[sample]) for i in range(n)]]

    def finish(self, count: int) -> None:
        """End the ``count`` oldest groups still under way."""
        import threading

        with self._lock:
            waiting = [k for k, _ in self.submitted if not self._done.setdefault(k, threading.Event()).is_set()]
        for key in waiting[:count]:
            self._done[key].set()

    def update_weights(self, state_dict, version):
        self.engine.policy_version = version
        return {}


def _versions_submitted(stack: _Stack, n: int, timeout_s: float = 30.0) -> list[int]:
    """The versions the first ``n`` groups were submitted under, once ``n`` have reached the stack."""
    deadline = time.monotonic() + timeout_s
    while len(stack.submitted) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # and no more than n arrive
    return [v for _, v in stack.submitted]


def test_at_most_k_plus_one_steps_of_groups_are_untrained_and_each_new_version_gets_its_share():
    """AReaL's bound: (K + 1) x tasks_per_step groups untrained at most, topped up under each new version, and
    never more than the run's steps still take."""
    stack = _Stack()
    tasks = [{"id": f"t{i}"} for i in range(10)]
    collector = SessionCollector(stack, tasks, 2, 2, 0, batches=3, prefetch=False,
                                 partial=PartialRollouts(max_staleness=1, max_groups_in_flight=4))
    try:
        collector.start({}, 0)
        assert _versions_submitted(stack, 4) == [0, 0, 0, 0]  # (K + 1) x tasks_per_step under version 0
        stack.finish(2)
        first = collector.collect()
        assert len(first.data) == 2 and _versions_submitted(stack, 4) == [0] * 4  # none before the next version
        collector.publish({}, 1)
        assert _versions_submitted(stack, 6) == [0, 0, 0, 0, 1, 1]  # version 1's share
        stack.finish(2)
        second = collector.collect()
        assert {r.samples[0].metadata["min_policy_version"] for g in second.data for r in g} == {0}
        collector.publish({}, 2)
        # the last step takes the two groups of version 1 under way: nothing more is submitted
        assert len(_versions_submitted(stack, 6)) == 6
        stack.finish(2)
        third = collector.collect()
        assert {r.samples[0].metadata["min_policy_version"] for g in third.data for r in g} == {1}
        assert collector.metrics()["partial/groups_stale"] == 0
    finally:
        stack.finish(100)
        collector.close()
