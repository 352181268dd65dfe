"""polar's GAIL against the ``imitation`` library's GAIL, on the same demonstrations, env and env-step budget.

    make imitation                                    # .imitation-venv: imitation 1.0.1 (gymnasium 0.29), torch 2.13.0
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/gail_vs_imitation.py --out runs/gail_bench --json gail.json

Per env (``--envs``):

1. **Expert.** polar's PPO trains with the shipped expert config (``examples/cartpole_ppo.yaml``,
   ``examples/imitation/inverted_pendulum_ppo.yaml``), then ``polar collect`` records ``--demo-episodes``
   deterministic episodes into a Minari dataset (``--out/<env>/expert-v0``). Both are reused when present. The
   expert's return is the dataset's episode return mean.
2. **polar GAIL.** ``polar run`` of the shipped GAIL config (``examples/imitation/<env>_gail.yaml``) on that
   dataset, budget ``--total-env-steps`` (default: the config's), no periodic evaluation.
3. **imitation GAIL.** ``benchmarks/_imitation_gail.py`` in ``.imitation-venv``: the same HDF5 file turned into
   ``imitation`` ``Trajectory``s, ``imitation.algorithms.adversarial.gail.GAIL`` with a Stable-Baselines3 PPO
   generator given polar's config values (``n_steps`` per env, env count, ``batch_size``, ``n_epochs``, ``gamma``,
   ``gae_lambda``, ``learning_rate``, ``ent_coef``, ``clip_range``, ``vf_coef``, ``max_grad_norm``, the hidden sizes),
   ``BasicRewardNet`` with the discriminator's hidden sizes, ``demo_batch_size`` = ``disc_batch_size``,
   ``n_disc_updates_per_round`` = ``disc_updates``, the discriminator's learning rate; the same env-step budget.
   imitation's gymnasium is 0.29, which has no MuJoCo v5 envs: its side runs ``InvertedPendulum-v4`` (same model
   and observations; v4 pays reward 1 on the terminating step too, v5 pays 0).
4. **Evaluation.** ``--eval-episodes`` deterministic episodes, seeds 10000, 10001, ... on both sides; a uniform
   random policy's return over the same seeds is the zero of the normalised score.

Prints one table: env, framework, seed, expert and random return, GAIL's return (mean +- std), the share of the
expert's return it recovered (raw, and normalised: (R - random) / (expert - random)), env steps, and wall seconds
of each side's whole process (start-up, training, evaluation) and of its training alone. ``--json OUT``: the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENVS = {
    # polar's env id, imitation's env id, expert config, GAIL config
    "cartpole": ("CartPole-v1", "CartPole-v1", "examples/cartpole_ppo.yaml", "examples/imitation/cartpole_gail.yaml"),
    "inverted_pendulum": ("InvertedPendulum-v5", "InvertedPendulum-v4", "examples/imitation/inverted_pendulum_ppo.yaml",
                          "examples/imitation/inverted_pendulum_gail.yaml"),
}
POLAR = [sys.executable, "-m", "polar.cli.main"]
IMITATION_PY = ROOT / ".imitation-venv" / "bin" / "python"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def _run(cmd: list[str], log: Path) -> float:
    """Runs ``cmd`` with its output in ``log``; its wall seconds. A failure prints the log's tail and exits."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT).returncode
    if rc != 0:
        sys.exit(f"{' '.join(cmd)} failed ({rc}); {log}:\n" + "\n".join(log.read_text().splitlines()[-20:]))
    return time.perf_counter() - t0


def expert_dataset(name: str, out: Path, episodes: int) -> tuple[Path, float]:
    """The expert's demonstrations (trained and collected unless already in ``out``) and their return mean."""
    from polar.datasets.minari import load_dataset

    _, _, expert_cfg, _ = ENVS[name]
    run, data = out / "expert", out / "expert-v0"
    if not (run / "eval" / "final.json").is_file():
        _run([*POLAR, "run", "--config", str(ROOT / expert_cfg), "--run-dir", str(run), "--no-progress"],
             out / "expert.log")
    if not (data / "data" / "metadata.json").is_file():
        _run([*POLAR, "collect", str(run), "--episodes", str(episodes), "--out", str(data)], out / "collect.log")
    return data, float(np.mean(load_dataset(data).episode_returns))


def random_return(env_id: str, episodes: int, seed: int) -> float:
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for i in range(episodes):
        env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def gail_config(name: str, dataset: Path, seed: int, total: int | None, eval_episodes: int) -> dict:
    cfg = yaml.safe_load((ROOT / ENVS[name][3]).read_text())
    cfg["policy"]["kwargs"]["dataset"] = str(dataset)
    cfg["seed"] = seed
    if total is not None:
        cfg["total_env_steps"] = total
    cfg["eval"] = {"episodes": eval_episodes, "every_n_iterations": 0, "at_end": True}
    cfg.setdefault("logging", {})["tensorboard"] = False
    return cfg


def run_polar(name: str, cfg: dict, out: Path, seed: int) -> dict:
    config = out / f"polar_gail_seed{seed}.yaml"
    config.write_text(yaml.safe_dump(cfg))
    run = out / f"polar_gail_seed{seed}"
    if run.exists():
        import shutil

        shutil.rmtree(run)
    wall = _run([*POLAR, "run", "--config", str(config), "--run-dir", str(run), "--no-progress"],
                out / f"polar_gail_seed{seed}.log")
    final = json.loads((run / "eval" / "final.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"returns": final["returns"], "return_mean": final["return_mean"], "return_std": final["return_std"],
            "env_steps": rows[-1]["env_steps"], "wall_s": wall, "train_s": rows[-1]["time_s"]}


def run_imitation(name: str, cfg: dict, dataset: Path, out: Path, seed: int) -> dict:
    if not IMITATION_PY.is_file():
        sys.exit(f"{IMITATION_PY} is missing: build it with `make imitation`")
    from polar.config.ppo import DEFAULT_BATCH_SIZE

    kw, dist = cfg["policy"]["kwargs"], cfg["distribution"]
    num_envs = int(dist.get("envs_per_worker", 1)) * max(1, int(dist.get("rollout_workers", 0)))
    n_steps = kw.get("n_steps") or -(-int(kw.get("rollout_samples", 1024)) // num_envs)
    ppo = {"n_steps": n_steps, "batch_size": kw.get("batch_size") or DEFAULT_BATCH_SIZE}
    defaults = {"n_epochs": 10, "gamma": 0.99, "gae_lambda": 0.95, "learning_rate": 3e-4, "ent_coef": 0.01,
                "clip_range": 0.2, "vf_coef": 0.5, "max_grad_norm": 0.5}  # polar's PPOKwargs defaults
    ppo.update({k: kw.get(k, v) for k, v in defaults.items()})
    result = out / f"imitation_gail_seed{seed}.json"
    wall = _run([str(IMITATION_PY), str(ROOT / "benchmarks" / "_imitation_gail.py"),
                 "--dataset", str(dataset / "data" / "main_data.hdf5"), "--env-id", ENVS[name][1],
                 "--total-env-steps", str(cfg["total_env_steps"]), "--num-envs", str(num_envs),
                 "--ppo", json.dumps(ppo), "--hidden", *map(str, cfg["agent"]["hidden_sizes"]),
                 "--disc-hidden", *map(str, kw.get("disc_hidden", [64, 64])),
                 "--disc-learning-rate", str(kw.get("disc_learning_rate", 3e-4)),
                 "--disc-updates", str(kw.get("disc_updates", 4)), "--disc-batch-size", str(kw.get("disc_batch_size", 256)),
                 "--eval-episodes", str(cfg["eval"]["episodes"]), "--seed", str(seed), "--out", str(result)],
                out / f"imitation_gail_seed{seed}.log")
    r = json.loads(result.read_text())
    return {"returns": r["returns"], "return_mean": r["return_mean"], "return_std": r["return_std"],
            "env_steps": r["env_steps"], "wall_s": wall, "train_s": r["train_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "gail_bench")
    p.add_argument("--envs", nargs="+", choices=sorted(ENVS), default=sorted(ENVS))
    p.add_argument("--frameworks", nargs="+", choices=["polar", "imitation"], default=["polar", "imitation"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--demo-episodes", type=int, default=20)
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--total-env-steps", type=int, default=None, help="the budget of both sides (default: the config's)")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    a = p.parse_args()
    rows = []
    for name in a.envs:
        out = a.out / name
        out.mkdir(parents=True, exist_ok=True)
        dataset, expert = expert_dataset(name, out, a.demo_episodes)
        rand = random_return(ENVS[name][0], a.eval_episodes, 10_000)
        for seed in a.seeds:
            cfg = gail_config(name, dataset, seed, a.total_env_steps, a.eval_episodes)
            for fw in a.frameworks:
                r = run_polar(name, cfg, out, seed) if fw == "polar" else run_imitation(name, cfg, dataset, out, seed)
                r.update(env=name, env_id=ENVS[name][0 if fw == "polar" else 1], framework=fw, seed=seed,
                         expert_return=expert, random_return=rand, share=r["return_mean"] / expert,
                         normalized_share=(r["return_mean"] - rand) / (expert - rand))
                rows.append(r)
                print(f"{name} {fw} seed {seed}: {r['return_mean']:.1f} ({100 * r['share']:.0f}% of {expert:.1f})",
                      flush=True)
    print()
    print("| env | framework | seed | expert return | random return | GAIL return | share of expert | normalised "
          "| env steps | wall s (process) | wall s (training) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['env_id']} | {r['framework']} | {r['seed']} | {r['expert_return']:.1f} | {r['random_return']:.1f} "
              f"| {r['return_mean']:.1f} ± {r['return_std']:.1f} | {100 * r['share']:.0f}% "
              f"| {100 * r['normalized_share']:.0f}% | {r['env_steps']:,} | {r['wall_s']:.0f} | {r['train_s']:.0f} |")
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
