"""Offline RL on datasets polar generates itself, against d3rlpy on the same files.

    make d3rlpy                                        # .d3rlpy-venv: d3rlpy 2.8.1 (it pins gymnasium 1.0.0), torch 2.13.0
    nice -n 19 .venv/bin/python benchmarks/offline_vs_d3rlpy.py --out runs/offline_bench

1. **Datasets.** polar's SAC trains on Pendulum-v1 and polar's DQN on CartPole-v1, one env, checkpointed and
   evaluated (``--source-eval`` deterministic episodes) every ``--source-iteration-steps`` env steps (default
   200 on Pendulum, 512 on CartPole: its DQN trains every 256). Training stops at the first iteration whose
   evaluation reaches half-way from random to expert (``random + 0.5 (expert - random)``, with random/expert
   -1230/-150 on Pendulum and 22/500 on CartPole); every checkpoint is kept. As in D4RL:
   - ``<env>-medium-v0``: ``--medium-episodes`` episodes of the policy whose evaluation is *nearest* half-way
     (learning curves jump, so the first checkpoint past half-way is often near-expert), acting as it did in
     training (SAC samples its Gaussian; DQN is epsilon-greedy with the epsilon it had reached), ``polar
     collect``'s code;
   - ``<env>-medium-replay-v0``: the replay buffer saved with the checkpoint where training stopped (every
     transition collected until the policy reached half-way), cut into episodes where an observation does not
     continue the previous step's next observation (one env); the last, unfinished episode is marked
     truncated.
   Both are Minari datasets (``polar.datasets.minari``).
2. **Offline training.** On each dataset: polar's BC, IQL and CQL, then d3rlpy's IQL (Box actions only: d3rlpy has
   no discrete IQL), CQL (``DiscreteCQL`` on CartPole) and BC, in a subprocess of ``.d3rlpy-venv`` that reads the
   same HDF5 file (benchmarks/_d3rlpy_offline.py). Same networks (``--hidden``, ReLU), batch size, gradient steps,
   learning rates and IQL/CQL coefficients on both sides (d3rlpy's defaults where polar's match them).
3. **Evaluation.** ``--eval-episodes`` deterministic episodes on the env, seeds 10000, 10001, ... for both.
   Wall time: polar's ``train()`` (dataset load, networks, gradient steps, final evaluation) and d3rlpy's
   ``fit`` (networks and gradient steps; its evaluation is timed apart and added), each single-threaded.

Prints one table: dataset, its return mean, algo, framework, seed, gradient steps, return mean +- std, wall seconds
and update seconds (the gradient steps alone: polar's ``time/learn_s``, d3rlpy's mean ``time_step`` x steps);
with ``--table`` over logs of several ``--seed`` runs, a second one: the mean over seeds of each row's return mean.
Datasets in ``--out`` are reused (``--seed`` then changes the offline runs only); polar's offline run directories
are ``--out/offline/<dataset>-<algo>-seed<N>``, replaced when that row runs again. ``--normalize-obs``: polar's
offline runs (BC, IQL and CQL alike) standardise observations by the dataset's mean/std
(``policy.kwargs.normalize_obs``, CORL's default); d3rlpy's rows are unchanged; their run directories end in
``-norm`` and their rows say ``normalize_obs``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENVS = {
    # id, source algorithm, random return, expert return (the reference points of "medium")
    "pendulum": ("Pendulum-v1", "sac", -1230.0, -150.0),
    "cartpole": ("CartPole-v1", "dqn", 22.0, 500.0),
}
SOURCE_ITERATION_STEPS = {"pendulum": 200, "cartpole": 512}  # a multiple of the DQN's train_freq (256)
# IQL's target critics' Polyak rate (--iql-tau overrides both). CORL's 0.005 is made for 1M gradient steps: at
# 10k, on CartPole (+1 every step: all its information is in the termination, ~100 steps back at gamma 0.99),
# the critics were still climbing at the end (q_mean 30 and rising ~3 per 1,000 steps, against a Monte-Carlo
# discounted return-to-go of 41 on medium-replay), so the actor was weighted by the advantages of a critic
# that had not converged. At 0.05 they level off by ~6k steps (docs/benchmarks.md). Pendulum's dense reward
# converges at 0.005.
IQL_TAU = {"pendulum": 0.005, "cartpole": 0.05}


def source_config(env: str, max_steps: int, eval_episodes: int, seed: int):
    from polar.config import RunConfig, validate

    env_id, algo, _, _ = ENVS[env]
    if algo == "sac":  # RL Zoo's Pendulum SAC, narrower networks
        policy = {"type": "sac", "kwargs": {"learning_rate": 1e-3, "batch_size": 128, "learning_starts": 200,
                                            "buffer_size": 100_000}}
        hidden = [64, 64]
    else:  # RL Zoo's CartPole DQN (examples/cartpole_dqn.yaml), narrower network
        policy = {"type": "dqn", "kwargs": {"learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000,
                                            "learning_starts": 1000, "target_update_interval": 10,
                                            "train_freq": 256, "gradient_steps": 128, "exploration_fraction": 0.16,
                                            "exploration_final_eps": 0.04}}
        hidden = [64, 64]
    return validate(RunConfig, {
        "name": f"{env}-{algo}-source", "seed": seed, "harness": {"type": "gymnasium", "id": env_id},
        "agent": {"type": "mlp", "hidden_sizes": hidden, "activation": "relu"}, "policy": policy,
        "distribution": {"backend": "local", "rollout_workers": 0, "envs_per_worker": 1},
        "total_env_steps": max_steps,
        "logging": {"tensorboard": False, "progress_bar": False, "checkpoint_freq": 1, "keep_checkpoints": 10_000},
        "eval": {"episodes": eval_episodes, "every_n_iterations": 1, "num_envs": 1, "at_end": False}})


def replay_episodes(path: Path, act_dtype):
    """The replay file's transitions (one env, in order) as Minari episodes."""
    from polar.datasets.minari import Episode

    with np.load(path, allow_pickle=False) as z:
        header = json.loads(str(z["header"]))
        if header["size"] == header["capacity"] and header["pos"] != 0:
            raise SystemExit(f"{path}: the replay buffer wrapped around; raise buffer_size")
        obs, nxt, act = z["obs"], z["next_obs"], z["actions"]
        rew, term = z["rewards"], z["terminated"]
    n = len(rew)
    ends = [i for i in range(n) if i == n - 1 or term[i] > 0 or not np.array_equal(nxt[i], obs[i + 1])]
    out, start = [], 0
    for e in ends:
        sl = slice(start, e + 1)
        terms = term[sl] > 0
        truncs = np.zeros(e + 1 - start, bool)
        if not terms[-1]:
            truncs[-1] = True  # a time limit, or the unfinished last episode
        out.append(Episode(np.concatenate([obs[sl], nxt[e:e + 1]]).astype(np.float32), act[sl].astype(act_dtype),
                           rew[sl].astype(np.float64), terms, truncs, seed=None))
        start = e + 1
    return out


def make_datasets(env: str, out: Path, args) -> dict[str, Path]:
    from polar.datasets.minari import write_dataset
    from polar.harness import make_vector_env
    from polar.rollout.episodes import collect_episodes
    from polar.trainers.build import build_trainer, create_run_dir
    from polar.trainers.checkpoint import CheckpointManager
    from polar.trainers.loading import load_policy_for_eval

    env_id, algo, rnd, expert = ENVS[env]
    target = rnd + 0.5 * (expert - rnd)
    medium, replay = out / f"{env}-medium-v0", out / f"{env}-medium-replay-v0"
    if medium.exists() and replay.exists():
        print(f"[{env}] datasets exist in {out}; reusing them", flush=True)
        return {"medium": medium, "medium-replay": replay}
    cfg = source_config(env, args.source_max_steps, args.source_eval, args.seed)
    run = out / f"{env}-{algo}-source"
    trainer = build_trainer(cfg, create_run_dir(cfg, run))
    trainer.iteration_env_steps = args.source_iteration_steps or SOURCE_ITERATION_STEPS[env]
    evals: dict[int, float] = {}  # iteration -> its evaluation's return mean
    env_steps: dict[int, int] = {}

    def on_iteration(m):  # the iteration's evaluation is in eval/iter_<n>.json (written before this call)
        f = run / "eval" / f"iter_{m['iteration']:08d}.json"
        r = json.loads(f.read_text())["return_mean"] if f.is_file() else None
        print(f"[{env}] {algo} {m['env_steps']:>6} env steps: eval {r}", flush=True)
        if r is not None:
            evals[int(m["iteration"])], env_steps[int(m["iteration"])] = r, int(m["env_steps"])

    trainer.on_iteration = on_iteration
    budget = trainer.budget
    def reached() -> bool:
        return any(r >= target for r in evals.values())

    trainer.budget = lambda p: budget(p) or reached()
    t0 = time.perf_counter()
    trainer.train()
    src_s = time.perf_counter() - t0
    checkpoints = {int(p.stem.removeprefix("ckpt_")): p for p in CheckpointManager(run / "checkpoints").all()}
    candidates = {i: r for i, r in evals.items() if i in checkpoints}
    if not candidates:
        raise SystemExit(f"{run}: no evaluated checkpoint to collect from")
    iteration = min(candidates, key=lambda i: (abs(candidates[i] - target), i))
    ckpt, src_eval = checkpoints[iteration], candidates[iteration]
    print(f"[{env}] source {algo}: {ckpt.name} ({env_steps[iteration]} env steps), eval "
          f"{src_eval:.1f}, the evaluation nearest the target {target:.1f} of {len(candidates)}; {src_s:.0f} s"
          + ("" if reached() else "; the target was never reached"), flush=True)
    _, rcfg, policy, _, _ = load_policy_for_eval(ckpt)
    probe = make_vector_env(rcfg.harness, 1, seed=0)
    obs_space, act_space = probe.single_observation_space, probe.single_action_space
    probe.close()
    meta = {"env_id": env_id, "algorithm_id": f"polar-{algo}", "author": "benchmarks/offline_vs_d3rlpy.py",
            "code_permalink": str(ckpt)}
    write_dataset(medium, collect_episodes(policy, rcfg.harness, args.medium_episodes, seed=args.seed + 1000,
                                           deterministic=False), obs_space, act_space, **meta)
    last = max(checkpoints)  # where training stopped: the first evaluation past half-way, or the step limit
    print(f"[{env}] medium-replay: the replay buffer of {checkpoints[last].name} ({env_steps.get(last)} env steps)",
          flush=True)
    write_dataset(replay, replay_episodes(checkpoints[last].parent / f"replay_{last:08d}.npz", act_space.dtype),
                  obs_space, act_space, **{**meta, "code_permalink": str(checkpoints[last])})
    return {"medium": medium, "medium-replay": replay}


def polar_offline(env: str, algo: str, ds: Path, run: Path, args) -> dict:
    from polar.config import RunConfig, validate
    from polar.trainers.build import build_trainer, create_run_dir

    env_id = ENVS[env][0]
    kw: dict = {"dataset": str(ds), "gradient_steps": args.steps, "steps_per_iteration": args.steps,
                "batch_size": args.batch_size, "learning_rate": args.lr, "normalize_obs": args.normalize_obs}
    if algo == "iql":
        kw.update(gamma=args.gamma, tau=args.iql_tau or IQL_TAU[env], expectile=args.iql_expectile,
                  temperature=args.iql_temperature, max_weight=100.0, critic_hidden=args.hidden)
    elif algo == "cql":
        kw.update(gamma=args.gamma)
        if env == "cartpole":
            kw.update(tau=1.0, target_update_interval=args.target_update_interval)
        else:
            kw.update(tau=args.tau, actor_learning_rate=args.actor_lr)
    cfg = validate(RunConfig, {
        "name": f"{ds.name}-{algo}", "seed": args.seed, "harness": {"type": "gymnasium", "id": env_id},
        "agent": {"type": "mlp", "hidden_sizes": args.hidden, "activation": "relu"},
        "policy": {"type": algo, "kwargs": kw}, "distribution": {"backend": "local"},
        "logging": {"tensorboard": False, "progress_bar": False, "checkpoint_freq": 0},
        "eval": {"episodes": args.eval_episodes, "seed": 10_000, "num_envs": 1, "deterministic": True}})
    t0 = time.perf_counter()
    res = build_trainer(cfg, create_run_dir(cfg, run)).train()
    wall = time.perf_counter() - t0
    ev = res["eval"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    out = {"return_mean": ev["return_mean"], "return_std": ev["return_std"], "wall_s": wall,
           "update_s": sum(r.get("time/learn_s", 0.0) for r in rows)}
    if algo == "iql":  # the critics' mean target Q over the run's batches (one metrics row: one iteration)
        out.update(iql_tau=kw["tau"], q_mean=round(float(np.mean([r["q_mean"] for r in rows if "q_mean" in r])), 1))
    return out


def d3rlpy_offline(env: str, algo: str, ds: Path, args) -> dict:
    spec = {"dataset": str(ds), "env_id": ENVS[env][0], "algo": algo, "seed": args.seed, "hidden": args.hidden,
            "batch_size": args.batch_size, "gamma": args.gamma, "lr": args.lr, "actor_lr": args.actor_lr,
            "tau": (args.iql_tau or IQL_TAU[env]) if algo == "iql" else args.tau, "expectile": args.iql_expectile,
            "temperature": args.iql_temperature, "max_weight": 100.0, "steps": args.steps,
            "eval_episodes": args.eval_episodes, "eval_seed": 10_000,
            "target_update_interval": args.target_update_interval}
    env_vars = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([args.d3rlpy_python, str(ROOT / "benchmarks" / "_d3rlpy_offline.py"), json.dumps(spec)],
                       capture_output=True, text=True, env=env_vars, cwd=str(args.out))
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1][:200]}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return {"return_mean": res["return_mean"], "return_std": res["return_std"], "wall_s": res["train_s"] + res["eval_s"],
            "update_s": res["update_s"], "version": res["d3rlpy"]}


def dataset_return(ds: Path) -> tuple[float, int, int]:
    from polar.datasets.minari import load_dataset

    d = load_dataset(ds)
    return float(np.mean(d.episode_returns)), len(d.episode_returns), len(d)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "offline_bench")
    p.add_argument("--envs", default="pendulum,cartpole")
    p.add_argument("--algos", default="bc,iql,cql")
    p.add_argument("--steps", type=int, default=10_000, help="gradient steps per offline run")
    p.add_argument("--batch-size", type=int, default=256, help="the IQL paper's and CORL's (polar's default)")
    p.add_argument("--hidden", type=lambda s: [int(x) for x in s.split(",")], default=[256, 256],
                   help="actor and critics (the IQL paper's and CORL's; 64-64 leaves IQL's critic too weak on "
                        "Pendulum medium: docs/benchmarks.md)")
    p.add_argument("--lr", type=float, default=3e-4, help="critics' (and BC's, IQL's actor's) learning rate")
    p.add_argument("--actor-lr", type=float, default=1e-4, help="Box CQL's actor (d3rlpy's default)")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--tau", type=float, default=0.005, help="Polyak rate of Box CQL's target critics (both sides)")
    p.add_argument("--iql-tau", type=float, default=None,
                   help="IQL's target critics' Polyak rate (both sides; default per env: 0.005 Pendulum, 0.05 CartPole)")
    p.add_argument("--target-update-interval", type=int, default=100, help="discrete CQL's hard target copy")
    p.add_argument("--iql-expectile", type=float, default=0.7, help="IQL's tau (the paper's locomotion value)")
    p.add_argument("--iql-temperature", type=float, default=3.0, help="IQL's beta (the paper's locomotion value)")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--source-max-steps", type=int, default=40_000, help="env steps the source SAC/DQN may take")
    p.add_argument("--source-eval", type=int, default=5)
    p.add_argument("--source-iteration-steps", type=int, default=None,
                   help="env steps between the source's checkpoints and evaluations (default: per env, above)")
    p.add_argument("--medium-episodes", type=int, default=100, help="episodes in <env>-medium-v0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--normalize-obs", action="store_true", help="polar's BC/IQL/CQL standardise observations by the "
                   "dataset's mean/std (policy.kwargs.normalize_obs; not d3rlpy's rows)")
    p.add_argument("--d3rlpy-python", default=str(ROOT / ".d3rlpy-venv" / "bin" / "python"))
    p.add_argument("--no-d3rlpy", action="store_true")
    p.add_argument("--no-polar", action="store_true", help="d3rlpy's rows only (polar's were logged by another run)")
    p.add_argument("--d3rlpy-algos", default="iql,cql", help="the algos also run with d3rlpy (bc too: add it)")
    p.add_argument("--only-dataset", choices=["medium", "medium-replay"], default=None,
                   help="train on this one (runs per dataset can go side by side once the datasets exist)")
    p.add_argument("--table", action="store_true", help="only print the table of the rows in --out/*.log (runs "
                   "logged there with > OUT/NAME.log, e.g. --envs pendulum and --envs cartpole side by side)")
    args = p.parse_args()
    if args.table:  # the rows each run printed (JSON lines) into its log, as `benchmarks/... > OUT/<name>.log`
        print_table([json.loads(line) for f in sorted(args.out.glob("*.log"), reverse=True)
                     for line in f.read_text().splitlines() if line.startswith('{"dataset"')])
        return 0
    import torch

    torch.set_num_threads(1)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    use_d3rlpy = not args.no_d3rlpy
    if use_d3rlpy and not Path(args.d3rlpy_python).exists():
        print(f"{args.d3rlpy_python} not found: `make d3rlpy` first, or --no-d3rlpy", file=sys.stderr)
        return 2
    t_all = time.perf_counter()
    rows = []
    for env in args.envs.split(","):
        for kind, ds in make_datasets(env, args.out, args).items():
            if args.only_dataset and kind != args.only_dataset:
                continue
            ret, eps, n = dataset_return(ds)
            for algo in args.algos.split(","):
                sides = [] if args.no_polar else ["polar"]
                if use_d3rlpy and algo in args.d3rlpy_algos.split(",") and not (algo == "iql" and env == "cartpole"):
                    sides.append("d3rlpy")
                for fw in sides:
                    if fw == "polar":
                        run = args.out / "offline" / f"{ds.name}-{algo}-seed{args.seed}{'-norm' if args.normalize_obs else ''}"
                        if run.exists():  # this row is measured again: its earlier run goes
                            print(f"[{env}] replacing {run}", flush=True)
                            shutil.rmtree(run)
                        r = polar_offline(env, algo, ds, run, args)
                    else:
                        r = d3rlpy_offline(env, algo, ds, args)
                    name = {"cql": "DiscreteCQL", "bc": "DiscreteBC"}.get(algo, algo) if fw == "d3rlpy" and env == "cartpole" else algo
                    row = {"dataset": ds.name, "data_return": ret, "episodes": eps, "transitions": n, "algo": name,
                           "framework": fw, "seed": args.seed, "steps": args.steps, **r}
                    if fw == "polar" and args.normalize_obs:
                        row["normalize_obs"] = True
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    tag = (args.envs.replace(",", "_") + (f"_{args.only_dataset}" if args.only_dataset else "")
           + (f"_seed{args.seed}" if args.seed else "") + ("_norm" if args.normalize_obs else ""))
    (args.out / f"results_{tag}.json").write_text(json.dumps(rows, indent=1))
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s; steps {args.steps}, batch {args.batch_size}, hidden "
          f"{args.hidden}, eval {args.eval_episodes} deterministic episodes\n")
    print_table(rows)
    return 0


def _algo_label(row: dict) -> str:
    return row["algo"] + (" (normalize_obs)" if row.get("normalize_obs") else "")


def print_table(rows: list[dict]) -> None:
    """One row per run; then, where a (dataset, algo, framework, steps) ran with more than one seed, the mean over
    seeds of the per-seed return means, ± their std across seeds, and the mean wall and update seconds."""
    print("| dataset | data return (episodes, transitions) | algo | framework | seed | steps | return mean ± std | "
          "wall s | update s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        score = ("error: " + r["error"]) if "error" in r else f"{r['return_mean']:.1f} ± {r['return_std']:.1f}"
        wall = "" if "error" in r else f"{r['wall_s']:.1f} | {r['update_s']:.1f}"
        algo = _algo_label(r)
        print(f"| {r['dataset']} | {r['data_return']:.1f} ({r['episodes']}, {r['transitions']}) | {algo} | "
              f"{r['framework']} | {r.get('seed', '')} | {r.get('steps', '')} | {score} | {wall} |")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "error" not in r:
            groups.setdefault((r["dataset"], _algo_label(r), r["framework"], r.get("steps")), []).append(r)
    multi = {k: g for k, g in groups.items() if len({r.get("seed") for r in g}) > 1}
    if not multi:
        return
    print("\n| dataset | algo | framework | steps | seeds | return: mean over seeds ± std across seeds | "
          "mean wall s | mean update s |")
    print("|---|---|---|---|---|---|---|---|")
    for (ds, algo, fw, steps), g in multi.items():
        m = np.array([r["return_mean"] for r in g])
        seeds = ",".join(str(s) for s in sorted({r.get("seed") for r in g}))
        print(f"| {ds} | {algo} | {fw} | {steps} | {seeds} | {m.mean():.1f} ± {m.std():.1f} | "
              f"{np.mean([r['wall_s'] for r in g]):.1f} | {np.mean([r['update_s'] for r in g]):.1f} |")


if __name__ == "__main__":
    sys.exit(main())
