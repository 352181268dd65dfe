"""PPO update paths side by side: fused + flat Adam (polar's default) vs autograd + ``torch.optim.Adam``.

One real rollout of the default CartPole config (``policy: {type: ppo}``, built-in 64-64 MLP, 8 envs
x 128 steps = 1,024 samples, minibatches of 64, 10 epochs = 160 optimizer steps per update) is collected
once per trial; then ``PPOLearner.update`` runs on it again and again with each combination of

- gradient path: ``fused`` (``policy.kwargs.fused: auto``: ``fused_step``, the hand-derived gradient of
  ``autograd_step``'s loss, no graph recorded) or ``autograd`` (``fused: off``: ``autograd_step``);
- optimizer: polar's flat-buffer ``Adam`` (``polar.algorithms.optim``) or ``torch.optim.Adam(foreach=True)``
  with ``torch.nn.utils.clip_grad_norm_(foreach=True)``.

Each trial is a fresh process (the variants alternate, so they see the same machine load); it reports
optimizer steps per wall second and per CPU second of the process (the steadier figure on a
shared machine), and the seconds its first optimizer construction took (``torch.optim`` imports
``torch._dynamo`` on first construction; a PPO run imports it nowhere else).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ppo_update_paths.py --repeats 5

``--config zoo`` uses RL Zoo's CartPole settings instead (``examples/cartpole_ppo.yaml``: 8 envs x 32 steps =
256 samples, one minibatch of 256, 20 epochs = 20 optimizer steps per update), the update ``ppo_vs_sb3.py``
times. ``--baseline TREE`` also runs ``fused+flat`` from another source tree (a ``git worktree`` of an older
commit) in the same rotation, as ``baseline``: a before/after of the default path on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = [("fused", "flat"), ("autograd", "torch"), ("fused", "torch"), ("autograd", "flat")]

TRIAL = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
path, optim, updates, config = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
from polar.algorithms.ppo import PPOLearner
from polar.buffers.rollout_buffer import RolloutBuffer
from polar.config import RunConfig, load_config, validate
from polar.models.policy import build_policy
from polar.rollout.backends.base import make_backend
from polar.types import Batch, Rollout

fused = "auto" if path == "fused" else "off"
if config == "default":
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"},
                               "policy": {"type": "ppo", "kwargs": {"fused": fused}}})
else:  # RL Zoo's CartPole settings, as benchmarks/ppo_vs_sb3.py runs them
    cfg = load_config(config, [f'policy.kwargs.fused="{fused}"', "logging.tensorboard=false"])
torch.manual_seed(0)
backend = make_backend(cfg, cfg.policy.kwargs.steps_per_env(cfg.distribution.num_envs), seed=0)
policy = build_policy(cfg, backend.observation_space, backend.action_space)
backend.start(policy.state_dict(), 0, policy=policy)
frag = backend.next_fragment()
backend.close()


class TorchAdam:
    # torch.optim.Adam(foreach) behind the three calls PPOLearner makes of its optimizer
    def __init__(self, params, lr, eps):
        self.params = list(params)
        self.opt = torch.optim.Adam(self.params, lr=lr, eps=eps, foreach=True)

    lr = property(lambda self: self.opt.param_groups[0]["lr"],
                  lambda self, v: self.opt.param_groups[0].__setitem__("lr", v))

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=False)

    def clip_grad_norm_(self, max_norm):
        return torch.nn.utils.clip_grad_norm_(self.params, max_norm, foreach=True)

    def step(self):
        self.opt.step()


t0 = time.perf_counter()
learner = PPOLearner(policy.agent, cfg.policy.kwargs, cfg.total_env_steps)
if optim == "torch":
    learner.optimizer = TorchAdam(learner.params, cfg.policy.kwargs.learning_rate, cfg.policy.kwargs.adam_eps)
construct_s = time.perf_counter() - t0
assert learner.fused == (path == "fused")
learner.update(Batch(Rollout([frag], buffer=RolloutBuffer([frag])), env_steps=frag.env_steps))  # warm-up
steps, t, c = 0, time.perf_counter(), time.process_time()
for _ in range(updates):
    steps += learner.update(Batch(Rollout([frag], buffer=RolloutBuffer([frag])), env_steps=frag.env_steps))["n_updates"]
dt, dc = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"steps_per_s": steps / dt, "cpu_steps_per_s": steps / dc, "construct_s": construct_s}))
"""


def trial(path: str, optim: str, updates: int, config: str, tree: Path = ROOT) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(tree))
    p = subprocess.run([sys.executable, "-c", TRIAL, path, optim, str(updates), config], capture_output=True,
                       text=True, timeout=900, env=env, cwd=tree)
    if p.returncode != 0:
        raise RuntimeError(f"{path}+{optim} trial failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="trials per variant (fresh processes, interleaved)")
    ap.add_argument("--updates", type=int, default=5, help="timed PPO updates (x160 optimizer steps) per trial")
    ap.add_argument("--out", type=Path, default=None, help="also write the raw results as JSON here")
    ap.add_argument("--config", choices=["default", "zoo"], default="default",
                    help="polar's default CartPole PPO, or RL Zoo's (examples/cartpole_ppo.yaml)")
    ap.add_argument("--baseline", type=Path, default=None, metavar="TREE",
                    help="also run fused+flat from this source tree (e.g. a git worktree of an older commit)")
    args = ap.parse_args()
    config = "default" if args.config == "default" else str(ROOT / "examples" / "cartpole_ppo.yaml")
    variants = [(p, o, ROOT) for p, o in VARIANTS]
    if args.baseline:
        variants.insert(1, ("fused", "flat", args.baseline.resolve()))
    results: dict[str, list[dict]] = {f"{p}+{o}" + ("" if t == ROOT else " (baseline)"): [] for p, o, t in variants}
    loads = []
    for r in range(args.repeats):
        for p, o, tree in variants if r % 2 == 0 else variants[::-1]:
            res = trial(p, o, args.updates, config, tree)
            results[f"{p}+{o}" + ("" if tree == ROOT else " (baseline)")].append(res)
            loads.append(os.getloadavg()[0])
            print(f"  {p}+{o}: {res['steps_per_s']:,.0f} steps/s ({res['cpu_steps_per_s']:,.0f} per CPU s), "
                  f"optimizer construction {res['construct_s']:.2f} s "
                  f"(load {loads[-1]:.1f})", file=sys.stderr)
    med = {k: [statistics.median(x[f] for x in v) for f in ("steps_per_s", "cpu_steps_per_s", "construct_s")]
           for k, v in results.items()}
    base = med["autograd+torch"]
    what = ("default CartPole config (160 optimizer steps of 64 samples per update)" if args.config == "default"
            else "RL Zoo's CartPole config (20 optimizer steps of 256 samples per update)")
    print(f"\nPPO update, {what}, median of "
          f"{args.repeats}; load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    print(f"{'path + optimizer':29s}{'steps/s':>10s}{'ratio':>8s}{'steps/CPU s':>13s}{'ratio':>8s}{'1st construction s':>20s}")
    for k, (sps, cps, cs) in med.items():
        print(f"{k:29s}{sps:>10,.0f}{sps / base[0]:>7.2f}x{cps:>13,.0f}{cps / base[1]:>7.2f}x{cs:>20.2f}")
    print("ratio: against autograd+torch (torch.optim.Adam(foreach=True), the alternative to polar's own path)")
    if args.out:
        args.out.write_text(json.dumps({"results": results, "loads": loads}, indent=1))


if __name__ == "__main__":
    main()
