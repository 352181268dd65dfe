"""The autoscaling rule on synthetic signals (no Ray), its config checks, and one run that it resizes."""

import json

import pytest

from polar.config import RunConfig, validate
from polar.config.sections import AutoscaleConfig
from polar.errors import ConfigError
from polar.rollout.backends.autoscale import Autoscaler, ScaleSignals, decide
from polar.trainers.build import build_trainer
from polar.trainers.run_dir import RunDir

RULE = AutoscaleConfig(min_rollout_workers=1, max_rollout_workers=4, interval_s=10, step=1,
                       scale_up_wait_fraction=0.2, scale_down_queue_per_worker=1.0)


def sig(wait_s=0.0, queue=0.0, lag=0.0, workers=2, room=True, window_s=10.0):
    return ScaleSignals(window_s=window_s, learner_wait_s=wait_s, queue_depth_mean=queue, policy_lag_mean=lag,
                        workers=workers, room_for_one=room)


def test_learner_starved_of_fragments_scales_up_by_step():
    n, reason = decide(sig(wait_s=5.0), RULE)
    assert n == 3 and "waited 50%" in reason and "empty fragment queue" in reason
    big_step = RULE.model_copy(update={"step": 5})
    assert decide(sig(wait_s=5.0), big_step)[0] == 4  # never past max


def test_no_scale_up_at_max_or_without_room():
    n, reason = decide(sig(wait_s=9.0, workers=4), RULE)
    assert n == 4 and "max_rollout_workers=4" in reason
    n, reason = decide(sig(wait_s=9.0, room=False), RULE)
    assert n == 2 and "no room" in reason


def test_fragments_queueing_up_scales_down():
    n, reason = decide(sig(wait_s=0.1, queue=3.0, workers=3), RULE)
    assert n == 2 and "per worker" in reason
    # queued, but at the floor: hold
    assert decide(sig(wait_s=0.1, queue=3.0, workers=1), RULE)[0] == 1
    # queued but the learner also waited a fair share (between the thresholds): hold
    assert decide(sig(wait_s=1.5, queue=3.0, workers=3), RULE)[0] == 3


def test_policy_lag_rule_only_when_configured():
    s = sig(wait_s=0.0, queue=0.5, lag=6.0, workers=3)
    assert decide(s, RULE)[0] == 3
    lag_rule = RULE.model_copy(update={"scale_down_policy_lag": 4.0})
    n, reason = decide(s, lag_rule)
    assert n == 2 and "policy lag 6.00" in reason


def test_balanced_signals_hold_and_out_of_range_counts_are_pulled_back():
    n, reason = decide(sig(wait_s=1.5, queue=0.5), RULE)
    assert n == 2 and reason.startswith("hold")
    assert decide(sig(workers=6), RULE)[0] == 4
    assert decide(sig(workers=0), RULE.model_copy(update={"min_rollout_workers": 2}))[0] == 2


def test_autoscaler_windows_signals_and_decides_once_per_interval():
    now = [100.0]
    a = Autoscaler(RULE, clock=lambda: now[0])
    for _ in range(4):
        a.observe(wait_s=1.0, queue_depth=0, policy_lag=1)
    now[0] += 5.0
    assert not a.due()
    now[0] += 5.0
    assert a.due()
    n, reason, s = a.step(workers=2, room_for_one=True)
    assert "waited 40%" in reason
    assert (n, s.learner_wait_s, s.window_s) == (3, 4.0, 10.0) and s.policy_lag_mean == 1.0
    assert not a.due() and a.wait_s == 0.0  # a fresh interval
    a.enabled = False
    now[0] += 60.0
    assert not a.due()


BASE = {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"}}


@pytest.mark.parametrize("dist, match", [
    ({"backend": "ray", "rollout_workers": 2, "autoscale": {"min_rollout_workers": 3, "max_rollout_workers": 2}},
     "min_rollout_workers \\(3\\) is above max_rollout_workers \\(2\\)"),
    ({"backend": "ray", "rollout_workers": 5, "autoscale": {"max_rollout_workers": 3}}, "must lie within"),
    ({"backend": "local", "autoscale": {"max_rollout_workers": 3}}, "set backend: ray"),
    ({"backend": "ray", "rollout_workers": 1, "autoscale": {"max_rollout_workers": 3, "scale_up_wait_fraction": 1.5}},
     "scale_up_wait_fraction"),
])
def test_bad_autoscale_configs_are_refused_with_the_key(dist, match):
    with pytest.raises(ConfigError, match=match):
        validate(RunConfig, {**BASE, "distribution": dist})


def test_autoscale_config_defaults():
    cfg = validate(RunConfig, {**BASE, "distribution": {"backend": "ray", "rollout_workers": 1,
                                                         "autoscale": {"max_rollout_workers": 3}}})
    a = cfg.distribution.autoscale
    assert (a.min_rollout_workers, a.max_rollout_workers, a.step) == (1, 3, 1)


@pytest.mark.ray
def test_autoscale_rule_adds_workers_and_polar_scale_overrides_it(ray_cluster, tmp_path):
    """Slow envs starve the learner, so the rule scales up; a `polar scale` request then wins."""
    from polar.distributed.control import request_scale

    cfg = validate(RunConfig, {
        "name": "autoscale",
        "harness": {"type": "gymnasium", "id": "tests.distributed.slow_env:SlowCartPole-v0"},
        "policy": {"type": "appo", "kwargs": {"n_steps": 32, "n_epochs": 1, "batch_size": 64}},
        "distribution": {"backend": "ray", "coordinator_address": ray_cluster.address, "rollout_workers": 1,
                         "envs_per_worker": 2, "rollout_resources": {"num_cpus": 0.5},
                         "autoscale": {"min_rollout_workers": 1, "max_rollout_workers": 3, "interval_s": 2.0}},
        "total_env_steps": 200_000,
        "logging": {"checkpoint_freq": 0, "tensorboard": False, "progress_bar": False},
        "eval": {"at_end": False},
    })
    run = RunDir.create("autoscale", tmp_path / "run")
    rows = []

    def watch(m):
        rows.append(m)
        if m["rollout/workers"] >= 2 and "asked" not in watch.__dict__:
            watch.asked = True
            request_scale(run.path, 1)  # a person overrides the rule
        if "asked" in watch.__dict__ and m["rollout/workers"] == 1 and m.get("autoscale/enabled") == 0:
            raise _Done

    with pytest.raises(_Done):
        build_trainer(cfg, run, on_iteration=watch).train()
    workers = [r["rollout/workers"] for r in rows]
    assert workers[0] == 1 and max(workers) >= 2
    events = [json.loads(line) for line in (run.path / "scale_events.jsonl").read_text().splitlines()]
    auto = [e for e in events if e["source"] == "autoscale"]
    assert auto and auto[0]["from"] == 1 and auto[0]["to"] == 2
    assert "empty fragment queue" in auto[0]["reason"] and auto[0]["signals"]["wait_fraction"] > 0.2
    assert events[-1]["source"] == "request" and events[-1]["to"] == 1
    assert rows[-1]["rollout/scale_events"] == len(events)


class _Done(Exception):
    """Raised from the progress callback to end a run early once the test saw what it needed."""
