"""The one training loop and its seams: a Collector, a Learner and an Evaluator are all a new kind of run needs,
and build.py is the one place that composes them for a config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from polar.algorithms.appo import APPOLearner
from polar.algorithms.dqn import DQNLearner
from polar.algorithms.ppo import PPOLearner
from polar.algorithms.sac import SACLearner
from polar.config import RunConfig, validate
from polar.metrics.logger import read_metrics
from polar.rollout.backends.collector import EnvCollector
from polar.rollout.backends.replay import ReplayCollector
from polar.trainers.build import build_trainer, progress_total, run_kind
from polar.trainers.checkpoint import load_checkpoint
from polar.trainers.env_run import PolicyLearner
from polar.trainers.loop import TrainingLoop, env_steps_budget
from polar.trainers.ray_driver import RayLearnerDriver
from polar.trainers.run_dir import RunDir
from polar.types import Batch, Collector, Learner, Metrics, NoEvaluation


def env_cfg(**over: Any) -> Any:
    return validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"},
                                "logging": {"tensorboard": False, "checkpoint_freq": 2, "progress_bar": False},
                                "eval": {"at_end": False}, **over})


class CountingCollector:
    """Batches of 10 env steps and one finished episode of return ``n``; records what was published."""

    def __init__(self) -> None:
        self.n = 0
        self.published: list[int] = []
        self.closed = False

    def start(self, weights: Mapping[str, Any], version: int) -> None:
        self.started_at = version

    def collect(self) -> Batch:
        self.n += 1
        return Batch(data=self.n, env_steps=10, episode_returns=[float(self.n)], episode_lengths=[10],
                     policy_versions=[len(self.published)])

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        assert weights == {"w": self.n}
        self.published.append(version)

    def metrics(self) -> Metrics:
        return {"collector/batches": self.n}

    def close(self) -> None:
        self.closed = True

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.n = int(state["iteration"])  # one batch per iteration


class CountingLearner:
    """A Learner that 'learns' the sum of the batches it saw; every third batch changes nothing."""

    def __init__(self, collector: CountingCollector) -> None:
        self.collector = collector
        self.total = 0

    def update(self, batch: Batch[int]) -> Metrics:
        if batch.data % 3 == 0:
            return {"update_skipped": 1}
        self.total += batch.data
        return {"update_skipped": 0, "sum_loss": float(self.total)}

    def weights(self) -> Mapping[str, Any]:
        return {"w": self.collector.n}

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.total = state["total"]


def counting_loop(cfg: Any, run: RunDir, resume: bool = False, **kw: Any) -> TrainingLoop[int]:
    """The loop composed of the counting collector and learner (as ``polar.trainers.build.compose`` composes a
    registry row's)."""
    state = None
    if resume:
        from polar.trainers.checkpoint import CheckpointManager

        state = CheckpointManager(run.checkpoints_dir).load_newest()[1]
    collector = CountingCollector()
    return TrainingLoop(cfg, run, collector, CountingLearner(collector), NoEvaluation(),
                        budget=env_steps_budget(cfg.total_env_steps), state=state, **kw)


def test_the_loop_counts_publishes_logs_and_checkpoints_through_the_two_seams(tmp_path):
    assert isinstance(CountingCollector(), Collector) and isinstance(CountingLearner(CountingCollector()), Learner)
    run = RunDir.create("loop", tmp_path / "run")
    rows: list[Metrics] = []
    trainer = counting_loop(env_cfg(total_env_steps=50), run, on_iteration=rows.append)
    result = trainer.train()
    assert result["env_steps"] == 50 and result["iterations"] == 5 and result["episodes"] == 5
    assert trainer.collector.closed
    # batch 3 changed nothing: no version for it, the rest published one version each, in order
    assert trainer.collector.published == [1, 2, 3, 4] and trainer.version == 4
    logged = read_metrics(run.metrics_path)
    assert [r["iteration"] for r in logged] == [1, 2, 3, 4, 5] == [r["iteration"] for r in rows]
    assert [r["env_steps"] for r in logged] == [10, 20, 30, 40, 50]
    assert [r["update_skipped"] for r in logged] == [0, 0, 1, 0, 0]
    assert [r["episode_reward_mean"] for r in logged] == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert [r["policy_lag"] for r in logged] == [0, 0, 0, 0, 0]  # each batch acted with the newest weights
    assert logged[-1]["collector/batches"] == 5
    ckpts = sorted(p.name for p in run.checkpoints_dir.glob("ckpt_*.pt"))
    assert ckpts == ["ckpt_00000002.pt", "ckpt_00000004.pt", "ckpt_00000005.pt"]
    state = load_checkpoint(run.checkpoints_dir / "ckpt_00000004.pt")
    assert state["total"] == 1 + 2 + 4 and state["iteration"] == 4 and state["policy_version"] == 3
    assert run.read_meta()["status"] == "finished"


def test_resume_continues_from_the_checkpoint_and_cuts_rows_logged_after_it(tmp_path):
    run = RunDir.create("loop", tmp_path / "run")
    counting_loop(env_cfg(total_env_steps=50), run).train()
    (run.checkpoints_dir / "ckpt_00000005.pt").unlink()  # as if the run died after logging iteration 5
    (run.checkpoints_dir / "LATEST").unlink(missing_ok=True)
    again = counting_loop(env_cfg(total_env_steps=70), RunDir.open(run.path), resume=True)
    result = again.train()
    assert result["iterations"] == 7 and result["env_steps"] == 70
    assert again.collector.started_at == 3  # the checkpoint's version
    logged = read_metrics(run.metrics_path)
    assert [r["iteration"] for r in logged] == [1, 2, 3, 4, 5, 6, 7]  # iteration 5 logged once, not twice
    assert load_checkpoint(run.checkpoints_dir / "ckpt_00000007.pt")["total"] == 1 + 2 + 4 + 5 + 7


def test_stop_reward_ends_the_run_once_the_window_is_full(tmp_path):
    result = counting_loop(env_cfg(total_env_steps=1000), RunDir.create("loop", tmp_path / "run"), episode_window=2,
                           stop_reward=3.5).train()
    assert result["stopped_early"] and result["iterations"] == 4  # returns 3 and 4 average 3.5


def test_every_env_learner_has_the_one_signature_and_every_env_collector_is_a_collector():
    import inspect

    from polar.algorithms.bc import BCLearner
    from polar.algorithms.cql import CQLLearner, DiscreteCQLLearner
    from polar.algorithms.iql import IQLLearner
    from polar.rollout.backends.multi_agent import MultiAgentCollector
    from polar.rollout.dataset import DatasetCollector
    from polar.trainers.multi_agent import MultiPolicyLearner

    for cls in (PPOLearner, APPOLearner, DQNLearner, SACLearner, BCLearner, IQLLearner, CQLLearner, DiscreteCQLLearner):
        (param,) = list(inspect.signature(cls.update).parameters.values())[1:]  # update(batch) and nothing else
        assert param.annotation.startswith("Batch["), cls
        assert hasattr(cls, "state_dict") and hasattr(cls, "load_state_dict"), cls
    for cls in (PolicyLearner, MultiPolicyLearner):
        assert issubclass(cls, Learner), cls
    for cls in (EnvCollector, ReplayCollector, DatasetCollector, MultiAgentCollector):
        assert issubclass(cls, Collector), cls


@pytest.mark.parametrize("policy, learner_cls, collector_cls", [
    ("ppo", PPOLearner, EnvCollector), ("appo", APPOLearner, EnvCollector),
    ("dqn", DQNLearner, ReplayCollector), ("sac", SACLearner, ReplayCollector)])
def test_build_composes_every_env_algorithm_for_every_backend(tmp_path, policy, learner_cls, collector_cls):
    harness = "Pendulum-v1" if policy == "sac" else "CartPole-v1"
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": harness}, "policy": {"type": policy}})
    assert run_kind(cfg) == "env" and progress_total(cfg) == cfg.total_env_steps
    with build_trainer(cfg, RunDir.create("x", tmp_path / "local")) as loop:
        assert type(loop) is TrainingLoop and type(loop.collector) is collector_cls
        assert type(loop.learner) is PolicyLearner and type(loop.learner.algorithm) is learner_cls
    ray = cfg.model_copy(update={"distribution": cfg.distribution.model_copy(update={"backend": "ray"})})
    assert type(build_trainer(ray, RunDir.create("x", tmp_path / "ray"))) is RayLearnerDriver


def test_a_loop_built_but_never_trained_leaves_no_log_handler_behind(tmp_path):
    """Composing a run opens its log lines (a handler on the ``polar`` logger, ``POLAR_RUN_DIR``) before it builds
    the parts; a loop that is then only inspected (restored, read) and closed, never trained, must take them
    away again, or every later log line of the process goes on into that run's ``logs/``."""
    import logging
    import os

    from polar.metrics.logs import JsonLinesHandler

    def run_handlers() -> list[logging.Handler]:
        return [h for h in logging.getLogger("polar").handlers if isinstance(h, JsonLinesHandler)]

    before = run_handlers()
    with build_trainer(env_cfg(), RunDir.create("x", tmp_path / "run")) as loop:
        assert len(run_handlers()) == len(before) + 1 and os.environ["POLAR_RUN_DIR"].endswith("run")
        loop.restore()
    assert run_handlers() == before and "POLAR_RUN_DIR" not in os.environ
    loop.close()  # a second close does nothing


def test_build_composes_the_one_loop_for_agent_runs(tmp_path):
    import sys

    from polar.inference import load_engine
    from polar.rollout.sessions.collector import SessionCollector
    from tests.agent_support.helpers import HERE, write_jsonl

    sys.path.insert(0, str(HERE))  # the harness module lives next to the agentic tests
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": "t0", "prompt": "Say something."}])
    cfg = validate(RunConfig, {
        "harness": {"type": "agent", "callable": "agents_for_tests:one_token"}, "tasks": str(tmp_path / "tasks.jsonl"),
        "model": {"name_or_path": "tiny"},
        "policy": {"type": "grpo", "kwargs": {"total_steps": 3, "tasks_per_step": 2, "group_size": 4}},
    })
    assert run_kind(cfg) == "agent" and progress_total(cfg) == 3 * 2 * 4  # sessions
    trainer = build_trainer(cfg, RunDir.create("x", tmp_path / "run"), engine=load_engine("tiny"))
    try:
        assert type(trainer) is TrainingLoop and isinstance(trainer.collector, SessionCollector)
        assert isinstance(trainer.learner, Learner) and not trainer.budget(trainer.progress)
        assert trainer.collector.total_batches == 3
    finally:
        for closer in trainer.close_after:  # the stack build_trainer started
            closer.close()


def test_a_warm_up_stage_runs_before_the_main_one_on_fresh_runs_only(tmp_path):
    """GRPO's shape: an SFT warm-up stage first (its own collector and learner, one new policy version), then
    ``total_steps`` iterations of one batch each as the budget."""
    from polar.trainers.loop import Stage, iterations_budget

    warm_collector = CountingCollector()
    warm = CountingLearner(warm_collector)
    order: list[str] = []
    warm_update = warm.update
    warm.update = lambda batch: (order.append("warm"), warm_update(batch))[1]  # type: ignore[method-assign]
    collector = CountingCollector()
    collector_start = collector.start
    collector.start = lambda w, v: (order.append("main start"), collector_start(w, v))[1]  # type: ignore[method-assign]
    run = RunDir.create("loop", tmp_path / "run")
    stage = Stage("sft", warm_collector, warm, budget=lambda p: p.iteration >= 4, log_every=1)
    loop = TrainingLoop(env_cfg(), run, collector, CountingLearner(collector), NoEvaluation(),
                        budget=iterations_budget(2), warm_up=[stage])
    result = loop.train()
    assert order == ["warm"] * 4 + ["main start"] and warm_collector.closed
    assert collector.started_at == 1  # the warm-up's weights are version 1
    assert result["iterations"] == 2 and result["sft"]["updates"] == 4
    assert result["sft"]["first"]["sum_loss"] == 1.0 and result["sft"]["last"]["sum_loss"] == 1 + 2 + 4
    logged = read_metrics(run.metrics_path)
    assert [r["sft/updates"] for r in logged if "sft/updates" in r] == [1, 2, 3, 4]
    assert [r["iteration"] for r in logged if "iteration" in r] == [1, 2]

    resumed_warm = CountingLearner(CountingCollector())
    state = load_checkpoint(run.checkpoints_dir / "ckpt_00000002.pt")
    again = TrainingLoop(env_cfg(), RunDir.open(run.path), CountingCollector(), resumed_warm, NoEvaluation(),
                         budget=iterations_budget(3), state=state,
                         warm_up=[Stage("sft", CountingCollector(), resumed_warm, budget=lambda p: p.iteration >= 4)])
    assert again.train()["iterations"] == 3 and "sft" not in again.summary  # a resumed run has had its warm-up


class SlowLearner(CountingLearner):
    """Each update takes ``update_s``; while it runs nothing else logs."""

    def __init__(self, collector: CountingCollector, update_s: float) -> None:
        super().__init__(collector)
        self.update_s = update_s

    def update(self, batch: Batch[int]) -> Metrics:
        import time

        time.sleep(self.update_s)
        return super().update(batch)


class ChattyCollector(CountingCollector):
    """A collector that reports its own progress (as the session collector does) while a slow batch comes in."""

    def collect(self) -> Batch:
        import logging
        import time

        for i in range(12):
            logging.getLogger("polar.rollout.test").info("collecting, %d/12", i)
            time.sleep(0.05)
        return super().collect()


def test_a_long_update_is_never_silent_for_longer_than_the_heartbeat(tmp_path, caplog, monkeypatch):
    """The standard: nothing is silent for more than 30 s. A learner update (or weight push, or evaluation)
    that runs longer than the heartbeat gets a line saying which stage of which iteration is still running;
    a stage that logs its own progress (the session collector) gets none from the heartbeat."""
    import logging

    import polar.metrics.heartbeat as heartbeat

    monkeypatch.setattr(heartbeat, "HEARTBEAT_S", 0.3)
    monkeypatch.setattr(heartbeat, "POLL_S", 0.02)
    caplog.set_level(logging.INFO, logger="polar")
    run = RunDir.create("loop", tmp_path / "run")
    collector = ChattyCollector()
    TrainingLoop(env_cfg(total_env_steps=20), run, collector, SlowLearner(collector, update_s=1.0), NoEvaluation(),
                 budget=env_steps_budget(20)).train()
    beats = [r.getMessage() for r in caplog.records if r.name == "polar.metrics.heartbeat"]
    for iteration in (1, 2):
        said = [m for m in beats if m.startswith(f"iteration {iteration}: updating the policy, still running after")]
        assert 2 <= len(said) <= 4, beats  # every 0.3 s of a 1 s update
    assert not any("collecting" in m for m in beats), beats  # the collector spoke every 0.05 s itself
    assert len(logging.getLogger("polar").handlers) == len([h for h in logging.getLogger("polar").handlers
                                                            if type(h).__name__ != "_LastLine"])
