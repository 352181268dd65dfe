"""A short check of the learner's CUDA paths, for a machine that has a GPU. Nothing depends on it.

    .venv/bin/python benchmarks/gpu_check.py

Without CUDA it says so and exits 0. With CUDA it checks, on the tiny model:

- ``learner_device(num_gpus=1)`` picks CUDA;
- a GRPO step (full fine-tune with a frozen KL reference, and LoRA with the adapters-off reference)
  under bf16 autocast and gradient checkpointing: weights, optimizer state and the reference on CUDA,
  every loss statistic finite, the weights moved, and the exported serving weights load into a CPU copy;
- a short PPO, APPO, DQN and SAC run with ``distribution.num_gpus: 1``: the learner trains a CUDA copy of
  the agent (its optimizer state, SAC's critics and temperature on CUDA too), the acting policy stays on
  CPU and holds the learner's weights after the run, and the weights moved.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _samples(n: int, length: int, vocab: int) -> list:
    import torch

    from polar.types import TrajectorySample

    g = torch.Generator().manual_seed(0)
    return [TrajectorySample(session_id=f"s{i}", token_ids=torch.randint(3, vocab, (length,), generator=g).tolist(),
                             loss_mask=[0] * 8 + [1] * (length - 8), logprobs=[-4.0] * length,
                             policy_versions=[0] * length, call_indices=[0] * length, reward=float(i % 2))
            for i in range(n)]


def check_grpo(lora: bool) -> str:
    import torch

    from polar.algorithms.grpo import GRPOLearner
    from polar.config.grpo import GRPOKwargs, LoraConfig
    from polar.inference.embedded import load_weights
    from polar.inference.tiny import build_tiny
    from polar.models.llm_policy import LLMPolicy
    from polar.trainers.device import learner_device

    device = learner_device(1)
    assert device.type == "cuda", device
    model, tok = build_tiny(0)
    serving = copy.deepcopy(model)  # the engine's copy, on CPU
    cfg = LoraConfig(r=4, alpha=8) if lora else None
    policy = LLMPolicy(model, tok, cfg, device=device, autocast="bf16", gradient_checkpointing=True)
    learner = GRPOLearner(policy, GRPOKwargs(kl_coef=0.05, lora=cfg, micro_batch_size=4, learning_rate=1e-3))
    assert all(p.is_cuda for p in policy.model.parameters()), "policy weights not on CUDA"
    if learner.reference is not None:
        assert all(p.is_cuda for p in learner.reference.parameters()), "reference not on CUDA"
    before = [p.detach().clone() for p in policy.parameters()]
    t0 = time.perf_counter()
    stats = learner.optimize(_samples(8, 48, 200), [1.0, -1.0] * 4)
    step_s = time.perf_counter() - t0
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert stats["kl"] >= 0.0, stats
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True)), "no weight moved"
    assert all(s.is_cuda for st in learner.optimizer.state.values() for s in st.values()
               if isinstance(s, torch.Tensor) and s.dim() > 0), "optimizer state not on CUDA"
    load_weights(serving, policy.serving_state_dict())  # the engine copy takes the CUDA learner's weights
    return (f"GRPO {'LoRA' if lora else 'full'} on {device} (bf16 autocast, gradient checkpointing, "
            f"reference {learner.reference_kind}): loss {stats['policy_loss']:+.4f}, kl {stats['kl']:.2e}, "
            f"{step_s:.2f} s")


def check_env_learner(algo: str, tmp: Path) -> str:
    import torch

    from polar.config.base import validate
    from polar.config.run import RunConfig
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    off = {"learning_starts": 100, "batch_size": 64, "buffer_size": 5000, "gradient_steps": 1}
    env_id, kwargs, total = {
        "ppo": ("CartPole-v1", {"n_steps": 128, "batch_size": 64, "n_epochs": 2}, 1024),
        "appo": ("CartPole-v1", {"n_steps": 64, "n_epochs": 1}, 1024),
        "dqn": ("CartPole-v1", {**off, "train_freq": 4, "target_update_interval": 100}, 1000),
        "sac": ("Pendulum-v1", {**off, "train_freq": 8, "ent_coef": "auto"}, 1000),
    }[algo]
    cfg = validate(RunConfig, {
        "name": f"gpu-{algo}", "seed": 0, "harness": {"type": "gymnasium", "id": env_id},
        "policy": {"type": algo, "kwargs": kwargs}, "total_env_steps": total,
        "distribution": {"rollout_workers": 0, "envs_per_worker": 4, "num_gpus": 1},
        "logging": {"tensorboard": False, "checkpoint_freq": 0, "progress_bar": False}, "eval": {"at_end": False},
    })
    t0 = time.perf_counter()
    trainer = compose(cfg, RunDir.create(cfg.name, tmp / algo))
    initial = {k: v.detach().clone() for k, v in trainer.learner.parts.policy.agent.state_dict().items()}
    trainer.collector.close()
    trainer = compose(cfg, RunDir.create(cfg.name, tmp / f"{algo}-run"))
    result = trainer.train()
    wall = time.perf_counter() - t0
    parts = trainer.learner.parts
    agent, acting, learner = parts.train_agent, parts.policy.agent, trainer.learner.algorithm
    assert parts.device.type == "cuda", parts.device
    assert all(p.is_cuda for p in agent.parameters()), "learner agent not on CUDA"
    assert all(not p.is_cuda for p in acting.parameters()), "acting policy left CPU"
    for name in ("optimizer", "actor_optimizer", "critic_optimizer"):
        opt = getattr(learner, name, None)
        if opt is not None and not isinstance(opt, torch.optim.Optimizer):
            assert opt.exp_avg.is_cuda and opt.flat.is_cuda, f"{name} state not on CUDA"
        elif opt is not None:
            assert all(s.is_cuda for st in opt.state.values() for s in st.values()
                       if isinstance(s, torch.Tensor) and s.dim() > 0), f"{name} state not on CUDA"
    for name in ("critics", "critic_target", "target"):
        mod = getattr(learner, name, None)
        if mod is not None:
            assert all(p.is_cuda for p in mod.parameters()), f"{name} not on CUDA"
    learned = {k: v.cpu() for k, v in agent.state_dict().items()}
    now = acting.state_dict()
    assert all(torch.equal(now[k], v) for k, v in learned.items()), "acting policy lacks the learner's weights"
    assert any(not torch.equal(initial[k], v) for k, v in learned.items()), "no weight moved"
    return (f"{algo.upper()} on {trainer.device}: {result['env_steps']} env steps, "
            f"reward mean {result.get('episode_reward_mean', float('nan')):.1f}, {wall:.1f} s")


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine; nothing to check (exit 0)")
        return 0
    print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for lora in (False, True):
        print("  ok:", check_grpo(lora))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="polar-gpu-check-") as tmp:
        for algo in ("ppo", "appo", "dqn", "sac"):
            print("  ok:", check_env_learner(algo, Path(tmp)))
    print(f"gpu_check: passed (peak CUDA memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
