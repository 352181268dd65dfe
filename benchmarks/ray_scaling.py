"""Ray backend scaling and a side-by-side with RLlib PPO on CartPole-v1, in one run.

Two parts, each run in fresh subprocesses so "from process start" includes imports and cluster start:

1. Sampling throughput (forward pass only, weights republished after every fragment as in training):
   the local and the Ray backend with 1, 2 and 4 rollout workers.
2. Time to a 100-episode mean return of 475: polar PPO on the Ray backend, polar PPO on the local
   backend, and RLlib 2.60 PPO (its tuned CartPole example, 1 EnvRunner x 16 envs, in its own venv
   because it pins gymnasium 1.2.2). Timed from process start and from the first env reset in any
   process (polar: ``benchmarks/_firststep/sitecustomize.py``; RLlib: an ``on_episode_start`` callback).

Usage::

    .bench-venvs/rllib/bin/pip install torch==2.13.0 "ray[rllib]==2.60.0"   # once
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ray_scaling.py --seeds 0 1 2 --out results.jsonl

Prints markdown tables with ratios; raw results go to ``--out`` as JSON lines.
"""

from __future__ import annotations

import time

T_PROCESS_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RLLIB_PY = ROOT / ".bench-venvs" / "rllib" / "bin" / "python"

# polar PPO for the race: RL Zoo's CartPole hyperparameters, but 2 workers x 16 envs (1,024 samples per
# update) and 6 epochs instead of 20, so the learner does about RLlib's work per sample
PPO_KWARGS = {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 6, "ent_coef": 0.0,
              "learning_rate": 1e-3, "lr_schedule": "linear", "clip_range_schedule": "linear"}


def _first_step_time(path: str) -> float | None:
    d, base = os.path.split(path)
    times = []
    for name in os.listdir(d):
        if name.startswith(base + "."):
            try:
                times.append(float(Path(d, name).read_text()))
            except (OSError, ValueError):
                pass
    return min(times) if times else None


def _run_cfg(backend: str, workers: int, envs: int, seed: int, policy: dict, total: int):
    from polar.config import RunConfig, validate

    return validate(RunConfig, {
        "name": f"bench-{backend}",
        "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "policy": policy,
        "distribution": {"backend": backend, "rollout_workers": workers, "envs_per_worker": envs,
                         "rollout_resources": {"num_cpus": 1}},
        "total_env_steps": total,
        "stop_reward": 475,
        "seed": seed,
        "logging": {"checkpoint_freq": 0, "tensorboard": False, "progress_bar": False},
        "eval": {"at_end": False},
    })


# ---------------------------------------------------------------------------------------------- children
def child_sample(args) -> dict:
    import torch

    from polar.models.policy import build_policy
    from polar.rollout.backends.base import make_backend

    torch.set_num_threads(1)
    cfg = _run_cfg(args.backend, args.workers, args.envs, 0, {"type": "ppo", "kwargs": {"n_steps": args.n_steps}}, 10**9)
    backend = make_backend(cfg, args.n_steps, seed=0)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    backend.start(policy.state_dict(), 0, policy=policy)
    try:
        version = 0
        for _ in range(2 * max(1, args.workers)):  # warm-up: every worker has answered
            backend.next_fragment(timeout_s=300)
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            steps += backend.next_fragment(timeout_s=300).env_steps
            version += 1
            backend.publish_weights(policy.state_dict(), version)
        elapsed = time.perf_counter() - t0
    finally:
        backend.close()
    return {"part": "sample", "backend": args.backend, "workers": args.workers, "envs_per_worker": args.envs,
            "n_steps": args.n_steps, "env_steps": steps, "seconds": round(elapsed, 2),
            "env_steps_per_s": round(steps / elapsed, 1)}


def child_train(args) -> dict:
    # build_trainer: as `polar run` does; on the ray backend the learner is an actor and fragments go
    # rollout actor -> learner actor through the object store (this process only relays progress)
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir

    kwargs = json.loads(args.policy_kwargs) if args.policy_kwargs else (dict(PPO_KWARGS) if args.algo == "ppo" else {})
    policy = {"type": args.algo, "kwargs": kwargs}
    cfg = _run_cfg(args.backend, args.workers, args.envs, args.seed, policy, args.max_steps)
    last = {}

    def on_iteration(m):
        last.update(m, t_wall=time.time())

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(cfg, RunDir.create("bench", Path(tmp) / "run"), on_iteration=on_iteration)
        result = trainer.train()
    t_end = last.get("t_wall", time.time())
    t_first = _first_step_time(os.environ["POLAR_BENCH_FIRST_STEP_FILE"]) or T_PROCESS_START
    from_first = t_end - t_first
    return {
        "part": "train", "framework": f"polar-{args.backend}", "algo": args.algo, "seed": args.seed,
        "workers": args.workers, "envs_per_worker": args.envs, "reached": bool(result["stopped_early"]),
        "final_return": result.get("episode_reward_mean"), "env_steps": result["env_steps"],
        "wall_s_from_start": round(t_end - T_PROCESS_START, 2), "s_from_first_step": round(from_first, 2),
        "env_steps_per_s": round(result["env_steps"] / from_first, 1),
        "startup": {"first_step_s": round(t_first - T_PROCESS_START, 2)},
        "restarts": last.get("rollout/restarts"), "policy_lag_mean": last.get("rollout/policy_lag_mean"),
        "learner_wait_fraction": last.get("learner/wait_fraction"),
    }


# ---------------------------------------------------------------------------------------------- driver
def _spawn(cmd: list[str], extra_env: dict[str, str], timeout_s: float) -> dict | None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", **extra_env}
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print(f"  timed out after {timeout_s:.0f} s: {' '.join(cmd[-8:])}", file=sys.stderr)
        return None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    print(f"  failed ({out.returncode}): {' '.join(cmd[-8:])}\n{out.stderr[-1500:]}", file=sys.stderr)
    return None


def _polar_child(kind: str, timeout_s: float, **kw) -> dict | None:
    tmp = tempfile.mkdtemp(prefix="polar_bench_")
    extra = {"POLAR_BENCH_FIRST_STEP_FILE": os.path.join(tmp, "first_step"),
             "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks" / "_firststep"), str(ROOT)])}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return _spawn(cmd, extra, timeout_s)


def _rllib_child(seed: int, timeout_s: float) -> dict | None:
    if not RLLIB_PY.exists():
        print(f"  RLlib venv missing ({RLLIB_PY}); see this script's docstring", file=sys.stderr)
        return None
    # the same worker priority polar's local clusters use (Ray's default nices workers to 15)
    return _spawn([str(RLLIB_PY), str(ROOT / "benchmarks" / "rllib_cartpole.py"), "--seed", str(seed),
                   "--runners", "1", "--envs-per-runner", "16", "--max-s", str(timeout_s - 30)],
                  {"RAY_worker_niceness": "0"}, timeout_s)


def _med(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    if not vals:
        return None, None, None
    return min(vals), statistics.median(vals), max(vals)


def _fmt(t, digits=1):
    if t[1] is None:
        return "-"
    return f"{t[0]:,.{digits}f} / **{t[1]:,.{digits}f}** / {t[2]:,.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", choices=["sample", "train"])
    p.add_argument("--backend", default="ray")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--n-steps", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--algo", default="ppo")
    p.add_argument("--max-steps", type=int, default=500_000)
    p.add_argument("--policy-kwargs", default="", help="JSON kwargs for polar's policy (default: PPO_KWARGS)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--worker-counts", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--train-workers", type=int, default=2)
    p.add_argument("--train-envs", type=int, default=16)
    p.add_argument("--skip", nargs="*", default=[], choices=["sample", "train", "rllib", "local"])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    if args.child:
        result = child_sample(args) if args.child == "sample" else child_train(args)
        print(json.dumps(result), flush=True)
        return

    rows: list[dict] = []

    def keep(r):
        if r is not None:
            rows.append(r)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(r) + "\n")
        return r

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if "sample" not in args.skip:
        print("\n## Sampling throughput (env steps/s, forward pass only)\n")
        print(f"envs per worker {args.envs}, fragment {args.n_steps} steps, {args.seconds:g} s per cell\n")
        print("| rollout workers | local backend | ray backend | ray / local |\n|---|---|---|---|")
        for w in args.worker_counts:
            cell = {}
            for b in ("local", "ray"):
                r = keep(_polar_child("sample", 300, backend=b, workers=w, envs=args.envs, n_steps=args.n_steps,
                                      seconds=args.seconds))
                cell[b] = r["env_steps_per_s"] if r else None
            ratio = f"{cell['ray'] / cell['local']:.2f}x" if cell["local"] and cell["ray"] else "-"
            print(f"| {w} | {cell['local'] or '-':,} | {cell['ray'] or '-':,} | {ratio} |", flush=True)

    if "train" not in args.skip:
        print("\n## Time to 475 on CartPole-v1 (min / median / max over seeds)\n")
        pk = {"policy_kwargs": args.policy_kwargs} if args.policy_kwargs else {}
        races = [("polar-ray", lambda s: _polar_child("train", 600, backend="ray", workers=args.train_workers,
                                                       envs=args.train_envs, seed=s, **pk))]
        if "local" not in args.skip:
            races.append(("polar-local", lambda s: _polar_child("train", 600, backend="local", workers=0,
                                                                 envs=args.train_envs * args.train_workers, seed=s, **pk)))
        if "rllib" not in args.skip:
            races.append(("rllib", lambda s: _rllib_child(s, 600)))
        by: dict[str, list[dict]] = {name: [] for name, _ in races}
        for seed in args.seeds:  # interleaved so load drifts hit every framework alike
            for name, fn in races:
                r = keep(fn(seed))
                if r is not None:
                    by[name].append(r)
                    print(f"  {name} seed {seed}: reached={r['reached']} {r['env_steps']} steps, "
                          f"{r['wall_s_from_start']} s from start, {r['env_steps_per_s']} steps/s", flush=True)
        print("\n| run | reached | wall s from start | s from first env step | env steps | env steps/s |\n|---|---|---|---|---|---|")
        for name, rs in by.items():
            hits = sum(r["reached"] for r in rs)
            print(f"| {name} | {hits}/{len(rs)} | {_fmt(_med(rs, 'wall_s_from_start'))} | "
                  f"{_fmt(_med(rs, 's_from_first_step'))} | {_fmt(_med(rs, 'env_steps'), 0)} | "
                  f"{_fmt(_med(rs, 'env_steps_per_s'), 0)} |")
        if by.get("rllib") and by.get("polar-ray"):
            ray_sps = _med(by["polar-ray"], "env_steps_per_s")[1]
            rl_sps = _med(by["rllib"], "env_steps_per_s")[1]
            ray_t = _med(by["polar-ray"], "wall_s_from_start")[1]
            rl_t = _med(by["rllib"], "wall_s_from_start")[1]
            ray_f = _med(by["polar-ray"], "s_from_first_step")[1]
            rl_f = _med(by["rllib"], "s_from_first_step")[1]
            print(f"\npolar-ray / RLlib env steps/s (median): **{ray_sps / rl_sps:.2f}x** (target >= 1.5x)")
            print(f"RLlib / polar-ray time to 475 from process start (median): **{rl_t / ray_t:.2f}x**; "
                  f"from first env step: **{rl_f / ray_f:.2f}x** (target >= 1.0x)")


if __name__ == "__main__":
    main()
