"""Policy distillation (``policy.type: distill``): a small student trained by ``polar run`` against a fixed, big
teacher matches the teacher's actions on held-out states and exports like any policy; a teacher from another env
is refused in one line naming both spaces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from polar.algorithms.distill import ActionDistribution, policy_kl
from polar.config import RunConfig, validate
from polar.config.loader import dump_config
from polar.deploy.export import export_run
from polar.errors import ConfigError, RunDirError
from polar.models.policy import build_policy
from polar.trainers.checkpoint import CheckpointManager
from polar.trainers.loading import load_policy_for_eval, load_teacher
from polar.trainers.run_dir import RunDir

CONTROLLER = [0.1, 0.5, 10.0, 2.0]  # push right when this . obs > 0: balances CartPole for 500 steps


def _teacher_run(path: Path, env_id: str = "CartPole-v1") -> RunDir:
    """A run folder, as the trainer writes it, whose [64, 64] MLP acts as the linear controller: one unit of each
    hidden layer carries CONTROLLER . obs (the rest stay random and unread), the head turns its sign into sharp logits."""
    cfg = validate(RunConfig, {
        "name": "teacher", "harness": {"type": "gymnasium", "id": env_id},
        "agent": {"type": "mlp", "hidden_sizes": [64, 64]}, "policy": {"type": "ppo"},
        "logging": {"tensorboard": False, "progress_bar": False}})
    run = RunDir.create(cfg.name, path, config_dir=None)
    run.write_config(dump_config(cfg))
    env = gym.make(env_id)
    torch.manual_seed(0)
    policy = build_policy(cfg, env.observation_space, env.action_space)
    env.close()
    if env_id == "CartPole-v1":
        enc, head = policy.agent.pi_encoder, policy.agent.pi_head
        with torch.no_grad():
            enc[0].weight[0] = torch.tensor(CONTROLLER)
            enc[0].bias[0] = 0.0
            enc[2].weight[0].zero_()
            enc[2].weight[0, 0] = 5.0
            enc[2].bias[0] = 0.0
            head.weight.zero_()
            head.weight[:, 0] = torch.tensor([-8.0, 8.0])
            head.bias.zero_()
    CheckpointManager(run.checkpoints_dir).save(1, {"policy": policy.state_dict(), "iteration": 1, "env_steps": 0,
                                                    "policy_version": 1})
    return run


def _student_config(tmp_path: Path, teacher: str, total_env_steps: int = 16384) -> Path:
    config = tmp_path / "distill.yaml"
    config.write_text(yaml.safe_dump({
        "name": "student", "seed": 1, "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "agent": {"type": "mlp", "hidden_sizes": [16]},
        "policy": {"type": "distill", "kwargs": {"teacher": teacher, "n_steps": 256, "batch_size": 128, "temperature": 0.1,
                                                  "learning_rate": 0.01}},
        "total_env_steps": total_env_steps, "distribution": {"backend": "local", "rollout_workers": 0, "envs_per_worker": 4},
        "logging": {"tensorboard": False, "progress_bar": False}, "eval": {"at_end": False}}))
    return config


def _polar_run(config: Path, run: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(config), "--run-dir",
                           str(run)], capture_output=True, text=True, timeout=300)


def _held_out_states(n_episodes: int = 4, seed: int = 1000) -> np.ndarray:
    """States the teacher's controller visits from seeds the run never used."""
    env, states = gym.make("CartPole-v1"), []
    for s in range(n_episodes):
        obs, _ = env.reset(seed=seed + s)
        for _ in range(150):
            states.append(obs)
            obs, _, terminated, truncated, _ = env.step(int(np.dot(CONTROLLER, obs) > 0))
            if terminated or truncated:
                break
    env.close()
    return np.asarray(states, dtype=np.float32)


def test_student_matches_the_teacher_on_held_out_states_and_exports(tmp_path):
    teacher = _teacher_run(tmp_path / "teacher")
    run = tmp_path / "student"
    p = _polar_run(_student_config(tmp_path, str(teacher.path)), run)
    assert p.returncode == 0, p.stderr[-3000:]
    _, _, student, _, _ = load_policy_for_eval(run)
    assert sum(x.numel() for x in student.agent.pi_encoder.parameters()) < 100  # the student is the small one
    _, _, big, _, _ = load_policy_for_eval(teacher.path)
    states = torch.as_tensor(_held_out_states())
    with torch.no_grad():
        actions = student.act(states, None, True)[0]
        teacher_actions, _, info = big.act(states, None, True)
        confident = torch.softmax(info["logits"], -1).max(-1).values >= 0.9
    assert bool((teacher_actions.numpy() == (states.numpy() @ np.asarray(CONTROLLER, np.float32) > 0)).all())
    # where the teacher is sure (most held-out states), the student takes its action; overall it agrees on most
    # (the rest sit on the controller's boundary, where the teacher itself is near 50/50)
    assert float(confident.float().mean()) >= 0.5
    assert float((actions == teacher_actions)[confident].float().mean()) >= 0.97
    assert float((actions == teacher_actions).float().mean()) >= 0.85
    manifest = export_run(run, tmp_path / "export", samples=64)
    assert manifest["run"]["algorithm"] == "distill" and (tmp_path / "export" / "model.onnx").is_file()


def test_teacher_of_another_env_is_refused_in_one_line(tmp_path):
    teacher = _teacher_run(tmp_path / "teacher", "Acrobot-v1")
    p = _polar_run(_student_config(tmp_path, str(teacher.path), total_env_steps=256), tmp_path / "student")
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if "policy.kwargs.teacher" in line]
    assert len(lines) == 1, p.stderr[-2000:]
    assert "Box(" in lines[0] and "Discrete(3)" in lines[0] and "Discrete(2)" in lines[0], lines[0]
    assert "Traceback" not in p.stderr


def test_a_teacher_run_with_no_checkpoint_yet_is_refused_in_one_line(tmp_path):
    cfg = validate(RunConfig, {"name": "teacher", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
                               "policy": {"type": "ppo"}, "logging": {"tensorboard": False}})
    run = RunDir.create(cfg.name, tmp_path / "teacher", config_dir=None)
    run.write_config(dump_config(cfg))
    env = gym.make("CartPole-v1")
    with pytest.raises(ConfigError) as err:
        load_teacher(str(run.path), tmp_path, env.observation_space, env.action_space)
    assert str(err.value) == f"policy.kwargs.teacher {str(run.path)!r}: {run.path} has no checkpoint yet"
    with pytest.raises(RunDirError) as err2:  # polar eval / export / serve of the same run
        load_policy_for_eval(run.path)
    assert str(err2.value) == f"{run.path} has no checkpoint yet; nothing to evaluate."
    env.close()


@pytest.mark.parametrize("gaussian", [False, True])
def test_policy_kl_is_zero_only_at_the_teacher(gaussian):
    torch.manual_seed(0)
    if gaussian:
        mean, log_std = torch.randn(5, 2), torch.full((5, 2), -0.5)
        teacher = ActionDistribution(mean=mean, log_std=log_std)
        other = ActionDistribution(mean=mean + 0.3, log_std=log_std)
        ref = torch.distributions.kl_divergence(torch.distributions.Normal(mean, log_std.exp()),
                                                torch.distributions.Normal(mean + 0.3, log_std.exp())).sum(-1)
    else:
        logits = torch.randn(5, 3)
        teacher, other = ActionDistribution(logits=logits), ActionDistribution(logits=logits.flip(-1))
        ref = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=logits),
                                                torch.distributions.Categorical(logits=logits.flip(-1)))
    assert torch.allclose(policy_kl(teacher, teacher), torch.zeros(5), atol=1e-6)
    assert torch.allclose(policy_kl(teacher, other), ref, atol=1e-5)
