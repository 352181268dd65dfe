"""RLlib 2.60 PPO on CartPole-v1, timed to a 100-episode mean return; prints one JSON line.

Runs in its own venv (RLlib pins gymnasium 1.2.2): ``benchmarks/ray_scaling.py`` calls it as
``.bench-venvs/rllib/bin/python benchmarks/rllib_cartpole.py --seed 0``. It imports nothing from
polar. Hyperparameters are RLlib's tuned example (``rllib/examples/algorithms/ppo/cartpole_ppo.py``):
lr 3e-4, 6 epochs, vf_loss_coeff 0.01, one linear 32-unit layer shared with the value head; all else
is PPOConfig's default (train batch 4000, minibatch 128). The learner runs in the driver
(``num_learners=0``), the example's ``--no-tune`` mode.
"""

from __future__ import annotations

import time

T_PROCESS_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402


def _on_episode_start(*, episode=None, env_runner=None, **kwargs):
    """Record the wall time of the first env reset in any EnvRunner (a file per process, first write wins)."""
    path = os.environ.get("POLAR_BENCH_FIRST_STEP_FILE")
    if not path:
        return
    try:
        fd = os.open(f"{path}.{os.getpid()}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(repr(time.time()))


def _first_step_time(path: str) -> float | None:
    d, base = os.path.split(path)
    times = []
    for name in os.listdir(d):
        if name.startswith(base + "."):
            with open(os.path.join(d, name)) as f:
                times.append(float(f.read()))
    return min(times) if times else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runners", type=int, default=1)
    p.add_argument("--envs-per-runner", type=int, default=16)
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--max-s", type=float, default=300.0)
    args = p.parse_args()

    tmp = tempfile.mkdtemp(prefix="rllib_bench_")
    os.environ["POLAR_BENCH_FIRST_STEP_FILE"] = os.path.join(tmp, "first_step")

    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    t_imports = time.time()
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"POLAR_BENCH_FIRST_STEP_FILE": os.environ["POLAR_BENCH_FIRST_STEP_FILE"]}})
    t_init = time.time()
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=args.runners, num_envs_per_env_runner=args.envs_per_runner)
        .learners(num_learners=0)
        .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear", vf_share_layers=True))
        .callbacks(on_episode_start=_on_episode_start)
        .debugging(seed=args.seed)
    )
    algo = config.build_algo()
    t_built = time.time()
    ret, steps, hit, curve = float("nan"), 0, False, []
    while time.time() - T_PROCESS_START < args.max_s:
        result = algo.train()
        runners = result.get("env_runners", {})
        ret = float(runners.get("episode_return_mean", float("nan")))
        steps = int(runners.get("num_env_steps_sampled_lifetime", steps))
        curve.append((round(time.time() - T_PROCESS_START, 2), steps, round(ret, 1)))
        if ret >= args.target:
            hit = True
            break
    t_end = time.time()
    t_first = _first_step_time(os.environ["POLAR_BENCH_FIRST_STEP_FILE"]) or t_built
    algo.stop()
    ray.shutdown()
    from_first = t_end - t_first
    print(json.dumps({
        "framework": "rllib", "version": ray.__version__, "seed": args.seed, "runners": args.runners,
        "envs_per_runner": args.envs_per_runner, "reached": hit, "final_return": ret if ret == ret else None, "env_steps": steps,
        "wall_s_from_start": round(t_end - T_PROCESS_START, 2), "s_from_first_step": round(from_first, 2),
        "env_steps_per_s": round(steps / from_first, 1) if from_first > 0 else None,
        "startup": {"imports_s": round(t_imports - T_PROCESS_START, 2), "ray_init_s": round(t_init - t_imports, 2),
                    "build_s": round(t_built - t_init, 2), "first_step_s": round(t_first - T_PROCESS_START, 2)},
        "curve": curve,
    }), flush=True)


if __name__ == "__main__":
    main()
