"""IQL / BC on the CartPole datasets of benchmarks/offline_vs_d3rlpy.py, with the learning curve shown: every
``--every`` gradient steps, ``--episodes`` deterministic episodes (seeds 10000, ...) and why each ended (cart out
of bounds ``x``, pole ``theta``, time limit ``trunc``), and the learner's metrics (IQL: ``q_mean``, has the
critic levelled off?). At the end, for IQL: Q, V and advantage statistics on the dataset's transitions.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/offline_iql_curve.py --ds medium-replay --tau 0.005

The same learner and sampler as ``polar train`` (``polar.rollout.dataset``); ``--norm`` standardizes the
observations with the dataset's mean/std (CORL's ``normalize``), which polar's offline runs do not do.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from polar.algorithms.bc import BCLearner  # noqa: E402
from polar.algorithms.iql import IQLLearner  # noqa: E402
from polar.config import RunConfig, validate  # noqa: E402
from polar.datasets.minari import load_dataset  # noqa: E402
from polar.models.policy import build_policy  # noqa: E402
from polar.rollout.dataset import DatasetCollector  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split(chr(10))[0])
p.add_argument("--out", type=Path, default=ROOT / "runs" / "offline_bench")
p.add_argument("--ds", default="medium-replay", choices=["medium", "medium-replay"])
p.add_argument("--algo", default="iql", choices=["iql", "bc"])
p.add_argument("--steps", type=int, default=10000)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--expectile", type=float, default=0.7)
p.add_argument("--temperature", type=float, default=3.0)
p.add_argument("--hidden", default="256,256")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--tau", type=float, default=0.005)
p.add_argument("--norm", action="store_true")
p.add_argument("--every", type=int, default=2000)
p.add_argument("--episodes", type=int, default=10)
a = p.parse_args()
torch.set_num_threads(1)
hidden = [int(x) for x in a.hidden.split(",")]
ds = str(a.out / f"cartpole-{a.ds}-v0")
env = gym.make("CartPole-v1")
data = load_dataset(ds, None, env.observation_space, env.action_space, where="ds")
kw = dict(dataset=ds, gradient_steps=a.steps, batch_size=a.batch, learning_rate=3e-4)
if a.algo == "iql":
    kw.update(tau=a.tau, expectile=a.expectile, temperature=a.temperature, critic_hidden=hidden)
cfg = validate(RunConfig, {"name": "d", "seed": a.seed, "harness": {"type": "gymnasium", "id": "CartPole-v1"},
    "agent": {"type": "mlp", "hidden_sizes": hidden, "activation": "relu"}, "policy": {"type": a.algo, "kwargs": kw},
    "distribution": {"backend": "local"}})
torch.manual_seed(a.seed)
np.random.seed(a.seed)
policy = build_policy(cfg, env.observation_space, env.action_space)
k = cfg.policy.kwargs
learner = IQLLearner(policy.agent, k, env.observation_space, env.action_space) if a.algo == "iql" else BCLearner(policy.agent, k)
if a.norm:
    mu, sd = data.obs.mean(0), data.obs.std(0) + 1e-3
    data.obs[:] = (data.obs - mu) / sd
    data.next_obs[:] = (data.next_obs - mu) / sd
else:
    mu, sd = np.zeros(4, np.float32), np.ones(4, np.float32)
print("data", len(data), "terminated", data.terminated.sum(), "episodes", len(data.episode_returns), flush=True)
col = DatasetCollector(data, a.batch, lambda: a.every, a.seed)

def evaluate(n):
    rets, why = [], {"x": 0, "theta": 0, "trunc": 0}
    e = gym.make("CartPole-v1")
    for i in range(n):
        o, _ = e.reset(seed=10000 + i)
        R = 0.0
        while True:
            with torch.no_grad():
                act, _, _ = policy.act(torch.as_tensor(((o - mu) / sd)[None], dtype=torch.float32), None, True)
            o, r, term, trunc, _ = e.step(int(np.asarray(act).reshape(-1)[0]))
            R += float(r)
            if term or trunc:
                why["trunc" if trunc else ("x" if abs(o[0]) > 2.4 else "theta")] += 1
                break
        rets.append(R)
    return float(np.mean(rets)), float(np.std(rets)), why

t0 = time.time()
done = 0
while done < a.steps:
    st = learner.update(col.collect())
    done += a.every
    m, s, why = evaluate(a.episodes)
    print(done, f"eval {m:.1f} ± {s:.1f}", why, {kk: round(v, 3) for kk, v in st.items() if isinstance(v, float)}, f"{time.time()-t0:.0f}s", flush=True)
if a.algo == "iql":
    with torch.no_grad():
        o = torch.as_tensor(data.obs)
        act = torch.as_tensor(data.actions.astype(np.int64))
        qall = torch.min(learner.target[0].net(o), learner.target[1].net(o))
        v = learner.v(o)
        qa = qall.gather(1, act[:, None]).squeeze(1)
        adv = qa - v
        print("Q mean", qa.mean().item(), "V mean", v.mean().item(), "adv mean/std", adv.mean().item(), adv.std().item(),
              "adv quantiles", np.quantile(adv.numpy(), [0.05, 0.25, 0.5, 0.75, 0.95]).round(3))
        print("|Q(s,0)-Q(s,1)| quantiles", np.quantile((qall[:, 0] - qall[:, 1]).abs().numpy(), [0.25, 0.5, 0.75, 0.95]).round(3))
        # agreement between actor argmax and Q argmax
        out = policy.agent.act(o, None, True)[0]
        print("actor==argmaxQ", (out.reshape(-1) == qall.argmax(1)).float().mean().item(),
              "actor==data action", (out.reshape(-1) == act).float().mean().item())
