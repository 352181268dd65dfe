"""Where a GRPO step's signal comes from, on the tiny model, a few steps each: DAPO's dynamic sampling (drawing
groups until enough have rewards that differ, bounded, and skipping the step with a warning when none do),
online difficulty filtering over the tasks (its estimates restored through a real resume), overlong filtering
and the loss aggregation reaching the learner."""

import json
import logging
import sys

import pytest

from polar.config import load_config
from polar.metrics.logger import read_metrics
from polar.trainers.build import train_agentic
from polar.trainers.checkpoint import load_checkpoint, save_checkpoint
from polar.trainers.run_dir import RunDir
from tests.agent_support.helpers import HERE, write_jsonl

CONFIG = """
name: sampling
harness: {type: agent, callable: "agents_for_tests:one_token", timeout_s: 120}
tasks: tasks.jsonl
verifier: {type: "rewards_for_tests:by_kind"}
model: {name_or_path: tiny}
sessions: {max_run_workers: 16}
policy:
  type: grpo
  kwargs: {group_size: GROUP, tasks_per_step: 2, total_steps: TOTAL, learning_rate: 1.0e-6, micro_batch_size: 16,
           max_off_policy_steps: 0, eval_samples: 1, EXTRA}
logging: {checkpoint_freq: 1, tensorboard: false}
"""


def _run(tmp_path, kinds: dict[str, str], total_steps: int, extra: str, group_size: int = 8, resume: bool = False,
         run_dir: RunDir | None = None):
    from polar.inference import load_engine

    sys.path.insert(0, str(HERE))  # the harness/verifier module lives next to the tests
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": i, "kind": k, "prompt": f"Say something {i}."} for i, k in kinds.items()])
    path = tmp_path / f"run_{total_steps}.yaml"
    path.write_text(CONFIG.replace("TOTAL", str(total_steps)).replace("GROUP", str(group_size)).replace("EXTRA", extra))
    cfg = load_config(path)
    cfg = cfg.model_copy(update={"tasks": str(tmp_path / "tasks.jsonl")})
    cfg._config_dir = HERE
    run_dir = run_dir or RunDir.create("sampling", tmp_path / "run")
    summary = train_agentic(cfg, run_dir, resume=resume, engine=load_engine("tiny"))
    rows = [r for r in read_metrics(run_dir.metrics_path) if "reward_mean" in r]
    return summary, rows, run_dir


def test_dynamic_sampling_draws_until_enough_groups_have_a_signal(tmp_path):
    # 2 of 8 tasks give rewards that differ within a group (a learning rate too small to change that); a step
    # needs 2 such groups: without dynamic
    # sampling most steps would train on fewer (a first round holds both with probability 1/28)
    kinds = {f"m{i}": "mixed" for i in range(2)} | {f"f{i}": "flat" for i in range(6)}
    _, rows, _ = _run(tmp_path, kinds, 2, "dynamic_sampling: {max_extra_rounds: 12}")
    assert [r["groups_used"] for r in rows] == [2, 2]
    assert all(r["groups_drawn"] >= 2 for r in rows) and sum(r["groups_drawn"] for r in rows) > 4
    assert all(r["update_skipped"] == 0 for r in rows)
    # the rounds are logged, and only the groups with a signal joined the batch
    assert sum(r["dynamic_sampling/extra_rounds"] for r in rows) >= 1
    assert all(r["groups"] <= 2 + 2 for r in rows)


def test_dynamic_sampling_without_any_signal_skips_the_step_and_says_what_helps(tmp_path, caplog):
    kinds = {f"f{i}": "flat" for i in range(4)}
    with caplog.at_level(logging.WARNING, logger="polar.rollout.sessions.collector"):
        _, rows, _ = _run(tmp_path, kinds, 2, "dynamic_sampling: {max_extra_rounds: 2}", group_size=2)
    # bounded: the first round plus 2 extra rounds of tasks_per_step groups each, then the step is skipped
    assert [r["groups_drawn"] for r in rows] == [6, 6]
    assert [r["dynamic_sampling/extra_rounds"] for r in rows] == [2, 2]
    assert [r["env_steps"] for r in rows] == [12, 24]  # every session sampled counts, the left-out ones too
    assert all(r["update_skipped"] == 1 and r["samples"] == 0 for r in rows)
    warned = [m for m in caplog.messages if "the step is skipped" in m]
    assert len(warned) == 2 and all("group_size" in m and "difficulty_filter" in m for m in warned)


def test_dynamic_sampling_off_draws_one_round(tmp_path):
    kinds = {f"f{i}": "flat" for i in range(4)}
    _, rows, _ = _run(tmp_path, kinds, 1, "dynamic_sampling: {max_extra_rounds: 0}", group_size=2)
    assert rows[0]["groups_drawn"] == 2 and rows[0]["dynamic_sampling/extra_rounds"] == 0


def test_difficulty_filter_estimates_survive_a_resume_and_steer_the_draw(tmp_path):
    # "half" tasks score 0.5 (inside the band), "easy" ones 1.0 (outside); explore_share 0: never drawn once known
    kinds = {f"in{i}": "half" for i in range(4)} | {f"out{i}": "easy" for i in range(4)}
    extra = ("dynamic_sampling: {max_extra_rounds: 0}, "
             "difficulty_filter: {low: 0.1, high: 0.9, ema: 0.5, explore_share: 0.0}")
    _, _, run_dir = _run(tmp_path, kinds, 1, extra, group_size=2)
    last = sorted(run_dir.checkpoints_dir.glob("ckpt_*.pt"))[-1]
    ckpt = load_checkpoint(last)
    state = ckpt["task_difficulty"]
    assert sum(state["groups_seen"].values()) == 2 and set(state["estimates"]) <= set(kinds)
    for task_id, p in state["estimates"].items():
        assert p == (0.5 if task_id.startswith("in") else 1.0)
    # the resumed run must know every "out" task as always solved: only a restored state keeps it from them
    state["estimates"].update({f"out{i}": 1.0 for i in range(4)})
    state["groups_seen"].update({f"out{i}": 9 for i in range(4)})
    seen_in_before = sum(v for k, v in state["groups_seen"].items() if k.startswith("in"))
    save_checkpoint(last, ckpt)

    _, rows, _ = _run(tmp_path, kinds, 3, extra, group_size=2, resume=True, run_dir=run_dir)
    final = load_checkpoint(sorted(run_dir.checkpoints_dir.glob("ckpt_*.pt"))[-1])["task_difficulty"]
    assert {k: final["groups_seen"][k] for k in kinds if k.startswith("out")} == {f"out{i}": 9 for i in range(4)}
    assert sum(v for k, v in final["groups_seen"].items() if k.startswith("in")) == seen_in_before + 4
    assert rows[-1]["difficulty/tasks_seen"] >= 4
    assert sum(r["difficulty/tasks_skipped"] for r in rows[1:]) >= 1


def test_overlong_filter_leaves_cut_sessions_out(tmp_path):
    # one_token asks for max_tokens 1, so every call stops at the length limit: every session is cut
    kinds = {f"m{i}": "mixed" for i in range(2)}
    _, rows, _ = _run(tmp_path, kinds, 1, "overlong_filter: true, dynamic_sampling: {max_extra_rounds: 0}")
    # (a call that samples the end token first stops, not cut: rare on the tiny model, and left in)
    assert rows[0]["sessions_overlong_filtered"] >= 14 and rows[0]["samples"] == 0 and rows[0]["update_skipped"] == 1


@pytest.mark.parametrize("aggregation", ["dr_grpo", "gspo"])
def test_loss_aggregation_reaches_the_learner(tmp_path, monkeypatch, aggregation):
    import polar.algorithms.grpo as grpo

    seen: list[str] = []
    original = grpo.grpo_loss

    def spy(*args, **kwargs):
        seen.append(kwargs.get("aggregation", "token_mean"))
        return original(*args, **kwargs)

    monkeypatch.setattr(grpo, "grpo_loss", spy)
    kinds = {f"m{i}": "mixed" for i in range(2)}
    _, rows, _ = _run(tmp_path, kinds, 1, f"loss_aggregation: {aggregation}, dynamic_sampling: {{max_extra_rounds: 4}}")
    assert rows[0]["samples"] > 0 and seen and set(seen) == {aggregation}


CURRICULUM = """
name: levels
harness: {type: agent, callable: "agents_for_tests:one_token", timeout_s: 120}
tasks: {source: reasoning_gym, name: chain_sum, size: 4, curriculum: {num_terms: 0, num_digits: 0},
        advance: {threshold: 0.9, window_groups: 2}}
verifier: {type: "rewards_for_tests:solved"}
model: {name_or_path: tiny}
policy:
  type: grpo
  kwargs: {group_size: 2, tasks_per_step: 2, total_steps: TOTAL, micro_batch_size: 16, max_off_policy_steps: 0,
           dynamic_sampling: {max_extra_rounds: 0}}
logging: {checkpoint_freq: 1, tensorboard: false}
"""


def test_curriculum_levels_advance_with_the_pass_rate_and_survive_a_resume(tmp_path):
    from polar.inference import load_engine

    sys.path.insert(0, str(HERE))
    run_dir = RunDir.create("levels", tmp_path / "run")

    def run(total: int, resume: bool):
        path = tmp_path / f"levels_{total}.yaml"
        path.write_text(CURRICULUM.replace("TOTAL", str(total)))
        cfg = load_config(path)
        cfg._config_dir = HERE
        train_agentic(cfg, run_dir, resume=resume, engine=load_engine("tiny"))
        return [r for r in read_metrics(run_dir.metrics_path) if "reward_mean" in r]

    rows = run(2, False)
    # every session passes: each step's 2 groups fill the window and raise both attributes by one level
    assert [r["curriculum/num_terms"] for r in rows] == [1, 2] and [r["curriculum/advances"] for r in rows] == [1, 2]
    ckpt = load_checkpoint(sorted(run_dir.checkpoints_dir.glob("ckpt_*.pt"))[-1])
    assert ckpt["curriculum"] == {"levels": {"num_terms": 2, "num_digits": 2}, "advances": 2}
    # the tasks drawn after an advance are the new level's (their ids carry the advance count)
    index = [json.loads(line) for line in (run_dir.path / "sessions" / "index.jsonl").read_text().splitlines()]
    drawn = {r["metadata"]["rollout_step"]: r["metadata"]["dataset_task_id"] for r in index if "eval" not in r["metadata"]}
    assert "@" not in drawn[0] and drawn[1].endswith("@1")
    rows = run(3, True)
    assert rows[-1]["curriculum/num_terms"] == 3 and rows[-1]["curriculum/advances"] == 3
