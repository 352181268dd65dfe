"""Hierarchical runs end to end, in-process and small (a few hundred env steps): the checkpoint and resume,
polar eval, export refused, skills loaded from checkpoints (frozen or trained), and the bad-input messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from polar.config.base import validate
from polar.config.run import RunConfig
from polar.errors import ConfigError, PolarError
from polar.trainers.checkpoint import CheckpointManager, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TICK = "tests.hierarchy.envs:HierTick-v0"
SKILLS = [{"name": "tick", "subgoal": "tick"}, {"name": "free", "reward": "extrinsic"}]


def _cfg(steps: int = 256, skills: list[dict[str, Any]] | None = None, env: str = TICK, **extra: Any) -> RunConfig:
    return validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": env},
        "agent": {"type": "mlp", "hidden_sizes": [16]},
        "policy": {"type": "hierarchical", "kwargs": {
            "option_steps": 4, "skills": skills or SKILLS,
            "ppo": {"n_steps": 16, "batch_size": 32, "n_epochs": 2}}},
        "distribution": {"envs_per_worker": 4}, "total_env_steps": steps,
        "logging": {"tensorboard": False, "checkpoint_freq": 1, "progress_bar": False},
        "eval": {"at_end": True, "episodes": 4, "num_envs": 2}, **extra})


def _flat(env: str, tmp_path: Path, name: str) -> Path:
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": env}, "agent": {"type": "mlp", "hidden_sizes": [16]},
                               "policy": {"type": "ppo", "kwargs": {"n_steps": 16, "batch_size": 32, "n_epochs": 1}},
                               "distribution": {"envs_per_worker": 2}, "total_env_steps": 32,
                               "logging": {"tensorboard": False, "progress_bar": False}, "eval": {"at_end": False}})
    trainer, _, _ = _train(cfg, tmp_path, name)
    return Path(trainer.run_dir.path)


def _train(cfg: RunConfig, tmp_path: Path, name: str = "run") -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir

    rows: list[dict[str, Any]] = []
    trainer = build_trainer(cfg, RunDir.create(name, tmp_path / name), on_iteration=rows.append)
    return trainer, trainer.train(), rows


def test_a_hierarchical_run_trains_checkpoints_both_levels_and_resumes(tmp_path):
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir

    first, summary, rows = _train(_cfg(steps=128), tmp_path)
    assert [r["env_steps"] for r in rows] == [64, 128]
    assert {"manager/pg_loss", "options/decisions", "options/length_mean", "options/picked/tick"} <= set(rows[-1])
    assert rows[-1]["options/length_mean"] <= 4  # every option ends within k = 4 steps
    assert summary["eval"]["episodes"] == 4
    state = load_checkpoint(CheckpointManager(first.run_dir.checkpoints_dir).latest())
    assert set(state["policies"]["skills"]) == {"tick", "free"} and "manager" in state["policies"]
    assert set(state["learner"]["skills"]) == {"tick", "free"}
    assert all(a in ("tick", "free", None) for a in state["options"]["active_skill"])
    again = build_trainer(_cfg(steps=256), RunDir.open(first.run_dir.path), resume=True)
    again.restore()
    try:
        assert again.env_steps == 128 and again.iteration == 2
        for k, v in first.learner.skills["tick"].state_dict().items():
            assert torch.equal(again.learner.skills["tick"].state_dict()[k], v)
        for k, v in first.learner.manager.state_dict().items():
            assert torch.equal(again.learner.manager.state_dict()[k], v)
    finally:
        again.collector.close()
    _, _, rows2 = _train_resume(first.run_dir.path)
    assert [r["env_steps"] for r in rows2] == [192, 256]


def _train_resume(path: Path) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir

    rows: list[dict[str, Any]] = []
    trainer = build_trainer(_cfg(steps=256), RunDir.open(path), resume=True, on_iteration=rows.append)
    return trainer, trainer.train(), rows


def test_polar_eval_plays_manager_and_skills_and_export_is_refused(tmp_path):
    from polar.deploy.export import export_run
    from polar.trainers.build import evaluate_run

    trainer, _, _ = _train(_cfg(steps=64, eval={"at_end": False}), tmp_path)
    _, _, res = evaluate_run(trainer.run_dir.path, episodes=3)
    assert res["episodes"] == 3 and res["success_rate"] == 1.0 and set(res["picked"]) == {"tick", "free"}
    assert res["iteration"] == 1 and Path(res["written"]).is_file()
    with pytest.raises(PolarError, match=r"is a hierarchical run: its checkpoint holds a manager and skills, not one "
                                         r"policy, so it cannot be exported, served or recorded; evaluate it with polar eval"):
        export_run(trainer.run_dir.path, tmp_path / "out", trust_code=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "eval", str(trainer.run_dir.path), "--episodes", "2",
                        "--trust-code"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "success rate" in p.stdout and "100.0%" in p.stdout


def test_a_frozen_skill_keeps_its_checkpoint_weights_and_a_trained_one_learns(tmp_path):
    flat = _flat(TICK, tmp_path, "flat")
    flat_policy = load_checkpoint(CheckpointManager(flat / "checkpoints").latest())["policy"]
    skills = [{"name": "tick", "subgoal": "tick", "checkpoint": str(flat), "train": False},
              {"name": "free", "reward": "extrinsic", "checkpoint": str(flat)}]
    trainer, _, rows = _train(_cfg(steps=128, skills=skills, eval={"at_end": False}), tmp_path)
    frozen = trainer.learner.skills["tick"].state_dict()
    trained = trainer.learner.skills["free"].state_dict()
    assert all(torch.equal(frozen[k], v) for k, v in flat_policy.items())
    assert any(not torch.equal(trained[k], v) for k, v in flat_policy.items())
    assert not any(k.startswith("skill/tick/") for k in rows[-1]) and "skill/free/pg_loss" in rows[-1]


def test_a_missing_skill_checkpoint_is_an_error_naming_the_key(tmp_path):
    skills = [{"name": "tick", "subgoal": "tick", "checkpoint": str(tmp_path / "nope")}]
    with pytest.raises(ConfigError, match=r"^policy\.kwargs\.skills\[0\]\.checkpoint: .*nope does not exist; give a run "
                                          r"directory or a ckpt_\*\.pt file of a run on the same env$"):
        _train(_cfg(skills=skills), tmp_path)


def test_a_skill_checkpoint_of_another_env_is_an_error_naming_the_key(tmp_path):
    other = _flat("CartPole-v1", tmp_path, "cartpole")
    skills = [{"name": "free", "reward": "extrinsic"}, {"name": "tick", "subgoal": "tick", "checkpoint": str(other)}]
    with pytest.raises(ConfigError, match=r"^policy\.kwargs\.skills\[1\]\.checkpoint: .* does not fit this skill: "
                                          r"agent\..* has shape \(16, 4\), this env's skill needs \(16, 1\)"):
        _train(_cfg(skills=skills), tmp_path)


@pytest.mark.parametrize(("skills", "message"), [
    ([{"name": "a"}], "skill 'a': reward 'subgoal' needs a subgoal"),
    ([{"name": "a", "reward": "extrinsic", "train": False}], "skill 'a': train: false freezes the skill, so it needs a checkpoint"),
    ([{"name": "a", "subgoal": "x"}, {"name": "a", "subgoal": "y"}], "skills: the name 'a' is used twice"),
    ([], "skills"),
    ([{"name": "a", "subgoal": "x", "requires": ["y"]}], r"skills\[0\]\.requires: 'y' is no skill's subgoal \(subgoals: x\)"),
])
def test_bad_skill_settings_are_refused_naming_the_key(skills, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(skills=skills) if skills else validate(RunConfig, {
            "harness": {"type": "gymnasium", "id": TICK}, "policy": {"type": "hierarchical", "kwargs": {"skills": []}}})


@pytest.mark.parametrize(("change", "message"), [
    ({"distribution": {"envs_per_worker": 2, "rollout_workers": 2}}, "set backend: local and rollout_workers: 0"),
    ({"distribution": {"envs_per_worker": 2, "backend": "ray"}}, "steps its envs in this process; set distribution.backend: local"),
    ({"agent": {"type": "lstm"}}, "runs feed-forward agents"),
])
def test_what_a_hierarchical_run_cannot_do_is_refused_at_start(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        _train(_cfg(**change), tmp_path)


def test_a_skill_learns_from_its_subgoal_reward_alone(tmp_path):
    """The env pays nothing; the skill is paid subgoal_reward when 'press' comes to hold (after action 2). It
    learns to press: its entropy falls from ln 4 and its options get shorter (they end at the subgoal)."""
    cfg = validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": "tests.hierarchy.envs:HierPress-v0"},
        "agent": {"type": "mlp", "hidden_sizes": [16]}, "seed": 0,
        "policy": {"type": "hierarchical", "kwargs": {
            "option_steps": 8, "skills": [{"name": "press", "subgoal": "press"}],
            "ppo": {"n_steps": 32, "num_minibatches": 4, "n_epochs": 4, "learning_rate": 3e-3}}},
        "distribution": {"envs_per_worker": 4}, "total_env_steps": 128 * 30,
        "logging": {"tensorboard": False, "progress_bar": False}, "eval": {"at_end": False}})
    _, _, rows = _train(cfg, tmp_path)
    assert rows[0]["skill/press/entropy"] > 1.3 and rows[0]["options/length_mean"] > 2.5
    assert rows[-1]["skill/press/entropy"] < 1.0 and rows[-1]["options/length_mean"] < 2.3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"initiation_sets": False, "skills": [{"name": "a", "subgoal": "x"}, {"name": "b", "subgoal": "y", "requires": ["x"]}]},
     r"skills\[1\]\.requires: needs initiation_sets: true"),
    ({"skills": [{"name": "a", "subgoal": "x"}], "ppo": {"normalize_obs": True}},
     r"ppo\.normalize_obs / normalize_reward: not supported in hierarchical runs"),
])
def test_settings_a_hierarchical_run_cannot_honour_are_refused_naming_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        validate(RunConfig, {"harness": {"type": "gymnasium", "id": TICK},
                             "policy": {"type": "hierarchical", "kwargs": kwargs}})
