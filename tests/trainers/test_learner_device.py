"""The learner device rule (``polar.trainers.device.learner_device``) in the PPO/APPO/DQN/SAC trainers.

This box has no CUDA, so the CUDA branch itself runs in ``benchmarks/gpu_check.py`` on a GPU machine. Here:

- with ``distribution.num_gpus: 1`` and no CUDA, every env learner falls back to CPU with one log line and
  trains the acting policy in place (no copy);
- the device the rule picks is the one the learner trains on: with the rule's choice replaced and the
  copy path a CUDA learner takes forced, every learner tensor (agent, optimizer state, SAC's critics and
  temperature) lives on the learner's copy, the acting policy receives its weights after each update, and
  a checkpoint resumes into both.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch

import polar.trainers.device as device_mod
from polar.config.base import validate
from polar.config.run import RunConfig
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir

OFF_KWARGS = {"learning_starts": 100, "batch_size": 16, "buffer_size": 5000, "gradient_steps": 1}
RUNS: dict[str, tuple[str, dict[str, Any], int]] = {
    "ppo": ("CartPole-v1", {"n_steps": 64, "batch_size": 32, "n_epochs": 2}, 256),
    "appo": ("CartPole-v1", {"n_steps": 32, "n_epochs": 1}, 256),
    "dqn": ("CartPole-v1", {**OFF_KWARGS, "train_freq": 4, "target_update_interval": 100}, 1000),
    "sac": ("Pendulum-v1", {**OFF_KWARGS, "train_freq": 8, "ent_coef": "auto_0.5"}, 1000),
}


def _cfg(algo: str, num_gpus: float) -> Any:
    env_id, kwargs, total = RUNS[algo]
    return validate(RunConfig, {
        "name": f"{algo}-device", "seed": 0, "harness": {"type": "gymnasium", "id": env_id},
        "agent": {"type": "mlp", "hidden_sizes": [16, 16]}, "policy": {"type": algo, "kwargs": kwargs},
        "distribution": {"rollout_workers": 0, "envs_per_worker": 2, "num_gpus": num_gpus},
        "total_env_steps": total,
        "logging": {"tensorboard": False, "checkpoint_freq": 1, "progress_bar": False},
        "eval": {"at_end": False},
    })


def _trainer(algo: str, cfg: Any, run: RunDir, resume: bool = False) -> Any:
    return compose(cfg, run, resume=resume)


def _learner_tensors(trainer: Any) -> list[torch.Tensor]:
    """Every tensor the learner updates or keeps: its agent, optimizer state, and SAC's critics/targets/temperature."""
    learner, train_agent = trainer.learner.algorithm, trainer.learner.parts.train_agent
    out = [*train_agent.parameters(), *train_agent.buffers()]
    for name in ("optimizer", "actor_optimizer", "critic_optimizer", "ent_coef_optimizer"):
        opt = getattr(learner, name, None)
        if opt is None:
            continue
        if isinstance(opt, torch.optim.Optimizer):
            out += [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor) and t.dim()]
        else:  # polar's flat Adam
            out += [opt.flat, opt.flat_grad, opt.exp_avg, opt.exp_avg_sq]
    for name in ("critics", "critic_target", "target"):
        mod = getattr(learner, name, None)
        if mod is not None:
            out += list(mod.parameters())
    if getattr(learner, "log_ent_coef", None) is not None:
        out.append(learner.log_ent_coef)
    return out


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback; benchmarks/gpu_check.py covers CUDA")
@pytest.mark.parametrize("algo", list(RUNS))
def test_num_gpus_without_cuda_falls_back_to_cpu_with_a_log_line(algo, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(device_mod, "_logged", set())  # once per process: start this test's process afresh
    trainer = _trainer(algo, _cfg(algo, 1), RunDir.create(algo, tmp_path / "run"))
    with caplog.at_level(logging.WARNING, logger="polar.trainers.device"):
        trainer.train()
    assert [r.getMessage() for r in caplog.records if r.name == "polar.trainers.device"] == [
        "distribution.num_gpus=1 but CUDA is not available here; the learner runs on CPU"]
    assert trainer.learner.parts.device == torch.device("cpu")
    assert trainer.learner.parts.train_agent is trainer.learner.parts.policy.agent  # a CPU learner trains the acting policy in place
    assert all(t.device.type == "cpu" for t in _learner_tensors(trainer))


@pytest.mark.parametrize("algo", list(RUNS))
def test_learner_trains_on_the_device_the_rule_picks_and_the_acting_policy_follows(algo, tmp_path, monkeypatch):
    asked: list[float] = []
    copies: list[dict[str, torch.Tensor]] = []

    def rule(num_gpus: float) -> torch.device:
        asked.append(num_gpus)
        return torch.device("cpu")

    def forced_copy(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        copies.append({k: v.clone() for k, v in module.state_dict().items()})
        return copy.deepcopy(module).to(device)  # what learner_copy does when the device differs (CUDA)

    monkeypatch.setattr(device_mod, "learner_device", rule)
    monkeypatch.setattr(device_mod, "learner_copy", forced_copy)
    cfg = _cfg(algo, 2)
    path = tmp_path / "run"
    trainer = _trainer(algo, cfg, RunDir.create(algo, path))
    trainer.train()
    assert asked == [2.0] and trainer.learner.parts.device == torch.device("cpu")
    agent, acting = trainer.learner.parts.train_agent, trainer.learner.parts.policy.agent
    assert agent is not acting
    # the learner's tensors are all the copy's (none is the acting policy's)
    acting_ptrs = {t.data_ptr() for t in [*acting.parameters(), *acting.buffers()]}
    learner_tensors = _learner_tensors(trainer)
    assert all(t.device == trainer.learner.parts.device for t in learner_tensors)
    assert not acting_ptrs & {t.data_ptr() for t in learner_tensors}
    # the learner moved its copy's weights, and the acting policy (workers, evaluation, checkpoints) got them
    (initial,) = copies
    assert any(not torch.equal(v, agent.state_dict()[k]) for k, v in initial.items())
    assert _same_weights(acting, agent)

    # a resume loads the checkpoint into the acting policy and the learner's copy alike
    again = _trainer(algo, cfg.model_copy(update={"total_env_steps": 2 * cfg.total_env_steps}), RunDir.open(path),
                     resume=True)
    again.restore()
    try:
        assert again.learner.parts.train_agent is not again.learner.parts.policy.agent
        assert _same_weights(again.learner.parts.train_agent, agent) and _same_weights(again.learner.parts.policy.agent, agent)
    finally:
        again.collector.close()
