"""The d3rlpy side of benchmarks/offline_vs_d3rlpy.py: run with d3rlpy's own venv (``make d3rlpy``,
``.d3rlpy-venv/bin/python``), never imported by polar.

    .d3rlpy-venv/bin/python benchmarks/_d3rlpy_offline.py '{"dataset": DIR, "algo": "iql", ...}'

Reads a Minari dataset folder (``DIR/data/main_data.hdf5``) with h5py, trains one d3rlpy algorithm with the
hyperparameters given (the same as polar's run), evaluates it on the env and prints one JSON line:
``{"return_mean", "return_std", "episodes", "train_s", "update_s", "eval_s", "transitions", "d3rlpy"}``
(``train_s``: ``fit`` whole, building the networks included; ``update_s``: its mean step time x steps).

Episodes go to d3rlpy whole: a terminated episode's T steps with ``terminals[-1] = 1``; a truncated one's T steps
plus its final observation as one more row (a zero action and reward, ``timeouts = 1``), since d3rlpy drops the
last row's transition of an episode that did not terminate, and that row is the final observation here.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import h5py
import numpy as np


def load_minari(path: str):
    obs, acts, rews, terms, touts = [], [], [], [], []
    with h5py.File(Path(path) / "data" / "main_data.hdf5", "r") as f:
        for name in sorted(f, key=lambda k: int(k.split("_")[1])):
            ep = f[name]
            o = np.asarray(ep["observations"], np.float32)
            a = np.asarray(ep["actions"])
            r = np.asarray(ep["rewards"], np.float32)
            term = bool(np.asarray(ep["terminations"])[-1])
            t = len(r)
            if term:
                obs.append(o[:t])
                acts.append(a)
                rews.append(r)
                terms.append(np.eye(1, t, t - 1)[0])
                touts.append(np.zeros(t))
            else:
                obs.append(o)
                acts.append(np.concatenate([a, np.zeros_like(a[:1])]))
                rews.append(np.concatenate([r, [0.0]]))
                terms.append(np.zeros(t + 1))
                touts.append(np.eye(1, t + 1, t)[0])
    return (np.concatenate(obs), np.concatenate(acts), np.concatenate(rews).astype(np.float32),
            np.concatenate(terms).astype(np.float32), np.concatenate(touts).astype(np.float32))


def main() -> None:
    spec = json.loads(sys.argv[1])
    import d3rlpy
    import gymnasium as gym
    import torch
    from d3rlpy.dataset import MDPDataset
    from d3rlpy.models.encoders import VectorEncoderFactory

    torch.set_num_threads(1)
    d3rlpy.seed(spec["seed"])
    env = gym.make(spec["env_id"])
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    obs, acts, rews, terms, touts = load_minari(spec["dataset"])
    dataset = MDPDataset(obs, acts.astype(np.int64) if discrete else acts.astype(np.float32), rews, terms, touts,
                         action_space=d3rlpy.ActionSpace.DISCRETE if discrete else d3rlpy.ActionSpace.CONTINUOUS,
                         action_size=int(env.action_space.n) if discrete else None)
    enc = VectorEncoderFactory(hidden_units=list(spec["hidden"]))
    algo_name, b, gamma = spec["algo"], spec["batch_size"], spec["gamma"]
    scaler = None if discrete else d3rlpy.preprocessing.MinMaxActionScaler(
        minimum=env.action_space.low.astype(np.float32), maximum=env.action_space.high.astype(np.float32))
    if algo_name == "iql" and not discrete:
        cfg = d3rlpy.algos.IQLConfig(actor_learning_rate=spec["lr"], critic_learning_rate=spec["lr"], batch_size=b,
                                     gamma=gamma, tau=spec["tau"], expectile=spec["expectile"],
                                     weight_temp=spec["temperature"], max_weight=spec["max_weight"],
                                     actor_encoder_factory=enc, critic_encoder_factory=enc, value_encoder_factory=enc,
                                     action_scaler=scaler)
    elif algo_name == "cql" and not discrete:
        cfg = d3rlpy.algos.CQLConfig(actor_learning_rate=spec["actor_lr"], critic_learning_rate=spec["lr"],
                                     batch_size=b, gamma=gamma, tau=spec["tau"], actor_encoder_factory=enc,
                                     critic_encoder_factory=enc, action_scaler=scaler)
    elif algo_name == "cql":
        cfg = d3rlpy.algos.DiscreteCQLConfig(learning_rate=spec["lr"], batch_size=b, gamma=gamma,
                                             target_update_interval=spec["target_update_interval"],
                                             encoder_factory=enc)
    elif algo_name == "bc" and not discrete:
        cfg = d3rlpy.algos.BCConfig(learning_rate=spec["lr"], batch_size=b, policy_type="stochastic",
                                    encoder_factory=enc, action_scaler=scaler)
    elif algo_name == "bc":
        cfg = d3rlpy.algos.DiscreteBCConfig(learning_rate=spec["lr"], batch_size=b, encoder_factory=enc)
    else:
        raise SystemExit(f"d3rlpy has no {algo_name} for {'Discrete' if discrete else 'Box'} actions")
    algo = cfg.create(device="cpu:0")
    t0 = time.perf_counter()
    fitted = algo.fit(dataset, n_steps=spec["steps"], n_steps_per_epoch=spec["steps"], show_progress=False,
                      logger_adapter=d3rlpy.logging.NoopAdapterFactory(), save_interval=10**9)
    train_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    returns = []
    for i in range(spec["eval_episodes"]):
        o, _ = env.reset(seed=spec["eval_seed"] + i)
        total, done = 0.0, False
        while not done:
            a = algo.predict(np.asarray(o, np.float32)[None])[0]
            o, r, term, trunc, _ = env.step(int(a) if discrete else np.clip(a, env.action_space.low, env.action_space.high))
            total += float(r)
            done = term or trunc
        returns.append(total)
    print(json.dumps({"return_mean": float(np.mean(returns)), "return_std": float(np.std(returns)),
                      "episodes": len(returns), "train_s": train_s,
                      "update_s": float(fitted[-1][1].get("time_step", float("nan"))) * spec["steps"], "eval_s": time.perf_counter() - t1,
                      "transitions": len(rews), "d3rlpy": d3rlpy.__version__}))


if __name__ == "__main__":
    main()
