"""A short check of polar's GPU paths, for a machine that has a GPU. Nothing depends on it.

    .venv/bin/python benchmarks/gpu_check.py [--vllm-url URL]   # on a CUDA machine
    .venv/bin/python benchmarks/gpu_check.py --dry              # anywhere: every point's CPU-sized twin (CI)

The four points of issue 35, one line each (``ok``, ``not available on this tree``, ``skipped`` with the reason,
or ``FAIL``); the exit status is 0 only if none failed (and, on CUDA, none was skipped):

1. learner group: two learner processes join polar's learner process group
   (``polar.distributed.data_parallel.init_learner_group``: NCCL on CUDA, gloo with ``--dry``), average one
   split batch's gradients with polar's ``GradientAverager`` and take the step one process takes on the whole
   batch. ``distribution.num_learners`` must validate; on a tree without it the point is "not available".
   NCCL needs two GPUs (one rank per GPU).
2. vLLM weight transfer: on CUDA, polar's ``VllmNcclSender`` (``gateway.sync.method: nccl``) broadcasts a
   state dict into the vLLM server at ``--vllm-url`` (started with ``--weight-transfer-config
   '{"backend": "nccl"}'`` serving a model with the same parameter names). ``--dry``: the request bodies of that
   path (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
   ``/finish_weight_update``, ``/update_weight_version``) are posted over real HTTP to vLLM's own RL router
   (``.vllm-venv``) and parsed by vLLM's NCCL engine's own init/update types; skipped with the reason when
   ``.vllm-venv`` is absent.
3. a GRPO step on a Qwen2 model built from a config (random init, the tiny tokenizer; no weights ship):
   about 0.5B parameters on CUDA (bf16 autocast, gradient checkpointing), a 2-layer one with ``--dry``.
4. GPU metrics: ``polar.metrics.system.SystemSampler`` reports ``system/gpu<i>/{util_percent,mem_used_mb,
   mem_total_mb}`` for every GPU (needs ``nvidia-ml-py``); without a GPU it reports no ``system/gpu*`` key.

Without ``--dry`` and without CUDA it says so and exits 0. With CUDA it also checks, on the tiny model:

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
import json
import math
import subprocess
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



ROOT = Path(__file__).resolve().parents[1]
NOT_AVAILABLE = "not available on this tree"


class Skipped(Exception):
    """A point that cannot run here, with the reason (``--dry`` only; on CUDA a skip is a failure)."""


# ---------------------------------------------------------------- 3. a GRPO step on a config-built model
def qwen2_config(vocab_size: int, dry: bool):
    """0.63B parameters on CUDA (Qwen2.5-0.5B's shape with untied embeddings); 2 layers of width 64 with ``--dry``."""
    from transformers import Qwen2Config

    if dry:
        return Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           tie_word_embeddings=True)
    return Qwen2Config(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                       tie_word_embeddings=False)


def config_params(dry: bool) -> int:
    """Parameters of :func:`qwen2_config`'s model, counted on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(qwen2_config(1000, dry))
    return sum(p.numel() for p in model.parameters())


def check_grpo_config_model(dry: bool) -> str:
    import torch
    from transformers import AutoModelForCausalLM

    from polar.algorithms.grpo import GRPOLearner
    from polar.config.grpo import GRPOKwargs
    from polar.inference.tiny import build_tiny_tokenizer
    from polar.models.llm_policy import LLMPolicy

    full = config_params(False)
    if full < 0.5e9:
        raise AssertionError(f"the GPU config builds {full / 1e9:.2f}B parameters, below 0.5B")
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen2_config(len(tok), dry))
    n_params = sum(p.numel() for p in model.parameters())
    device = torch.device("cpu" if dry else "cuda")
    policy = LLMPolicy(model, tok, None, device=device, autocast="off" if dry else "bf16",
                       gradient_checkpointing=not dry)
    learner = GRPOLearner(policy, GRPOKwargs(kl_coef=0.0, micro_batch_size=4, learning_rate=1e-4))
    assert all(p.device.type == device.type for p in policy.model.parameters()), f"weights not on {device}"
    before = [p.detach().clone() for p in policy.parameters()]
    t0 = time.perf_counter()
    stats = learner.optimize(_samples(8, 48 if dry else 256, len(tok)), [1.0, -1.0] * 4)
    step_s = time.perf_counter() - t0
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True)), "no weight moved"
    scaled = f" (scaled down from the GPU config's {full / 1e9:.2f}B)" if dry else ""
    return (f"GRPO step on a config-built Qwen2 of {n_params / 1e6:.2f}M parameters{scaled} on {device}: "
            f"loss {stats['policy_loss']:+.4f}, {step_s:.2f} s")


# ---------------------------------------------------------------- 1. the learner group
def _group_rank(rank: int, world: int, init_method: str, dry: bool, out) -> None:  # a spawned process
    import torch

    from polar.distributed.data_parallel import GradientAverager, init_learner_group, leave_learner_group

    try:
        device = torch.device("cpu" if dry else f"cuda:{rank}")
        init_learner_group(rank, world, init_method, device, timeout_s=60.0)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        x, y = torch.randn(10, 16), torch.randn(10, 1)  # the same batch in every rank (same seed)
        ref = [p.detach().clone() for p in model.parameters()]
        model = model.to(device)
        lo, hi = (0, 3) if rank == 0 else (3, 10)  # uneven shards: the weighting by sample count matters
        loss = ((model(x[lo:hi].to(device)) - y[lo:hi].to(device)) ** 2).mean()
        loss.backward()
        GradientAverager()(list(model.parameters()), float(hi - lo))
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        # one process, the whole batch
        single = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        with torch.no_grad():
            for p, r in zip(single.parameters(), ref, strict=True):
                p.copy_(r)
        ((single(x) - y) ** 2).mean().backward()
        with torch.no_grad():
            for p in single.parameters():
                p -= 0.1 * p.grad
        err = max(float((a.detach().cpu() - b.detach()).abs().max()) for a, b in zip(model.parameters(), single.parameters(), strict=True))
        backend = torch.distributed.get_backend()
        leave_learner_group()
        out.put((rank, backend, err, ""))
    except BaseException as exc:  # reported by the parent, which fails the point
        out.put((rank, "", float("inf"), f"{type(exc).__name__}: {exc}"))


def check_learner_group(dry: bool) -> str:
    import torch
    import torch.multiprocessing as mp

    from polar.config.base import validate
    from polar.config.run import RunConfig

    try:
        cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"},
                                   "distribution": {"backend": "ray", "num_learners": 2}})
    except Exception as exc:
        if "num_learners" in str(exc):
            return f"{NOT_AVAILABLE} (distribution.num_learners is not a config key here)"
        raise
    if getattr(cfg.distribution, "num_learners", 1) != 2:
        return f"{NOT_AVAILABLE} (distribution.num_learners is not a key of this tree's config)"
    try:
        import polar.distributed.data_parallel  # noqa: F401
    except ImportError:
        return f"{NOT_AVAILABLE} (polar.distributed.data_parallel is missing)"
    if not dry and torch.cuda.device_count() < 2:
        raise AssertionError(f"NCCL learner group needs 2 GPUs (one rank per GPU); this machine has "
                             f"{torch.cuda.device_count()}")
    from polar.inference._http1 import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_group_rank, args=(r, 2, init_method, dry, out), daemon=True) for r in range(2)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    try:
        results = sorted(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    wall = time.perf_counter() - t0
    errors = [msg for _, _, _, msg in results if msg]
    assert not errors, f"learner ranks failed: {errors}"
    worst = max(err for _, _, err, _ in results)
    assert worst < 1e-5, f"2 learners' step differs from 1 learner's by {worst:.2e} (tolerance 1e-5)"
    return (f"learner group, 2 ranks on {results[0][1]}: the averaged step matches 1 learner's within {worst:.1e} "
            f"(distribution.num_learners: 2 validates), {wall:.1f} s")


# ---------------------------------------------------------------- 2. vLLM weight transfer
def _vllm_python() -> Path | None:
    cand = ROOT / ".vllm-venv" / "bin" / "python"
    return cand if cand.exists() else None


def start_vllm_bodies() -> subprocess.Popen[str] | str:
    """``--dry`` point 2, started first (importing vLLM is the slowest part): the process, or why it cannot run."""
    py = _vllm_python()
    if py is None:
        return "no .vllm-venv here (vLLM's request types are not importable)"
    from polar.inference.tiny import build_tiny

    model, _ = build_tiny(0)
    meta = [[k, str(v.dtype).split(".")[-1], list(v.shape)] for k, v in model.state_dict().items()]
    return subprocess.Popen([str(py), str(Path(__file__).with_name("gpu_check_vllm_bodies.py")), json.dumps(meta)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def check_weight_transfer(dry: bool, vllm_url: str | None, bodies: subprocess.Popen[str] | str | None = None) -> str:
    from polar.config.base import validate
    from polar.config.sync import WeightSyncConfig

    assert validate(WeightSyncConfig, {"method": "nccl"}).method == "nccl"  # the key that selects this path
    if dry:
        if bodies is None:
            bodies = start_vllm_bodies()
        if isinstance(bodies, str):
            raise Skipped(bodies)
        try:
            out, err = bodies.communicate(timeout=180)  # drains both pipes: a chatty vLLM import cannot block it
        except subprocess.TimeoutExpired:
            bodies.kill()
            bodies.communicate()
            raise
        if bodies.returncode != 0:
            raise AssertionError(f"vLLM rejected a request body: {err.strip().splitlines()[-1:]}")
        return out.strip().splitlines()[-1] + "; gateway.sync.method: nccl validates"
    if not vllm_url:
        raise AssertionError("vLLM GPU weight transfer needs --vllm-url of a vLLM server started with "
                             "--weight-transfer-config '{\"backend\": \"nccl\"}'")
    import httpx
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from polar.inference.weight_sync import VllmNcclSender, check_nccl_available

    check_nccl_available("vllm")
    served = httpx.get(f"{vllm_url}/v1/models", timeout=30).json()["data"][0]["id"]  # a local folder: no network
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(served))  # fresh weights: must differ

    def checksums() -> dict[str, str]:
        resp = httpx.post(f"{vllm_url}/weight_checker", json={"action": "checksum"}, timeout=120)
        resp.raise_for_status()
        return dict(resp.json()["checksums"])

    before = checksums()
    state = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    n_bytes = sum(v.numel() * v.element_size() for v in state.values())
    t0 = time.perf_counter()
    VllmNcclSender(vllm_url, timeout_s=300.0).send(state, 1)
    send_s = time.perf_counter() - t0
    after = checksums()
    changed = sum(before.get(k) != v for k, v in after.items())
    assert changed > 0, "no served weight changed after the NCCL transfer"
    version = httpx.get(f"{vllm_url}/weight_info", timeout=30).json().get("weight_version")
    assert str(version) == "1", f"weight_version after the transfer is {version!r}, not '1'"
    return (f"vLLM NCCL weight transfer into {vllm_url} ({served}): {n_bytes / 2**20:.0f} MiB in {send_s:.2f} s "
            f"({n_bytes / 2**30 / send_s:.2f} GiB/s), {changed}/{len(after)} served tensors changed, version 1")


# ---------------------------------------------------------------- 4. GPU metrics
def check_gpu_metrics(dry: bool) -> str:
    from polar.metrics.system import SystemSampler

    sample = SystemSampler(interval_s=1.0, gpu=True).sample()
    gpu = {k: v for k, v in sample.items() if k.startswith("system/gpu")}
    if dry:
        import torch

        if torch.cuda.is_available():
            raise Skipped("a GPU is present: the no-GPU case of the metrics is not this machine's")
        assert not gpu, f"no GPU, yet the sampler reported GPU keys: {sorted(gpu)}"
        assert "system/learner/rss_mb" in sample, sorted(sample)
        return f"GPU metrics without a GPU: no system/gpu* keys (documented), {len(sample)} system keys"
    import torch

    n = torch.cuda.device_count()
    want = {f"system/gpu{i}/{f}" for i in range(n) for f in ("util_percent", "mem_used_mb", "mem_total_mb")}
    missing = sorted(want - set(gpu))
    assert not missing, f"GPU metrics missing (install the gpu extra: pip install 'polar-rl[gpu]', i.e. nvidia-ml-py): {missing}"
    assert all(math.isfinite(v) and v >= 0 for v in gpu.values()), gpu
    assert all(gpu[f"system/gpu{i}/mem_total_mb"] > 0 for i in range(n)), gpu
    return "GPU metrics: " + ", ".join(f"{k.removeprefix('system/')} {v:.0f}" for k, v in sorted(gpu.items()))


def run_points(dry: bool, vllm_url: str | None) -> int:
    """Run the four points; one line each. 0 only if every point ran (with ``--dry``, a stated skip counts)."""
    bodies = start_vllm_bodies() if dry else None  # runs beside the learner group
    points = [("learner group", lambda: check_learner_group(dry)),
              ("weight transfer", lambda: check_weight_transfer(dry, vllm_url, bodies)),
              ("GRPO 0.5B", lambda: check_grpo_config_model(dry)),
              ("GPU metrics", lambda: check_gpu_metrics(dry))]
    failed = 0
    try:
        for name, fn in points:
            try:
                line = fn()
                status = "n/a" if line.startswith(NOT_AVAILABLE) else "ok"
                print(f"  {status}: {name}: {line}", flush=True)
            except Skipped as exc:
                print(f"  skipped: {name}: {exc}", flush=True)
                failed += 0 if dry else 1
            except Exception as exc:  # the check's own assertion or an error: said in one line, counted
                print(f"  FAIL: {name}: {type(exc).__name__}: {exc}", flush=True)
                failed += 1
    finally:
        if isinstance(bodies, subprocess.Popen) and bodies.poll() is None:
            bodies.kill()
            bodies.wait(timeout=10)
    return failed


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="run every point's CPU-sized equivalent (no CUDA needed)")
    ap.add_argument("--vllm-url", default=None, help="a vLLM server started with --weight-transfer-config "
                    "'{\"backend\": \"nccl\"}' (point 2 on CUDA)")
    args = ap.parse_args(argv)
    if args.dry:
        print(f"gpu_check --dry: CPU equivalents, torch {torch.__version__}", flush=True)
        failed = run_points(True, None)
        print(f"gpu_check --dry: {'passed' if not failed else f'{failed} point(s) failed'}")
        return 1 if failed else 0
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine; nothing to check (exit 0; --dry runs the CPU "
              "equivalents)")
        return 0
    print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    failed = run_points(False, args.vllm_url)
    for lora in (False, True):
        print("  ok:", check_grpo(lora))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="polar-gpu-check-") as tmp:
        for algo in ("ppo", "appo", "dqn", "sac"):
            print("  ok:", check_env_learner(algo, Path(tmp)))
    print(f"gpu_check: {'passed' if not failed else f'{failed} point(s) failed'} "
          f"(peak CUDA memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
