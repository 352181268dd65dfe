"""``polar collect RUN_DIR|CHECKPOINT --episodes N --out DATASET``: a Minari dataset of a trained policy's episodes.

Any env run's checkpoint (PPO/APPO/DQN/SAC/BC/IQL) acts on its own harness; ``--epsilon`` mixes in uniformly
random actions (a "medium" dataset from a good policy). The dataset folder is read by offline runs
(``policy: {type: bc|iql, kwargs: {dataset: DATASET}}``) and by ``minari.load_dataset``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write a Minari dataset of a trained policy's episodes (for offline RL / behaviour cloning)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="run directory, or a checkpoint file inside one")
    p.add_argument("--episodes", type=int, required=True, help="episodes to record")
    p.add_argument("--out", required=True, metavar="DATASET",
                   help="dataset folder to create (its name is the Minari id unless --dataset-id, e.g. cartpole-medium-v0)")
    p.add_argument("--dataset-id", default=None, help="Minari dataset id (default: the --out folder's name)")
    p.add_argument("--seed", type=int, default=0, help="env seed of the first episode (episode i: seed + i)")
    p.add_argument("--epsilon", type=float, default=0.0, help="probability of a uniformly random action per step")
    p.add_argument("--stochastic", action="store_true", help="sample the policy's actions instead of its mode")


def main(args: argparse.Namespace) -> int:
    from polar.cli._progress import cli_console
    from polar.datasets.minari import write_dataset
    from polar.errors import ConfigError
    from polar.rollout.episodes import collect_episodes
    from polar.trainers.loading import load_policy_for_eval

    if args.episodes < 1:
        raise ConfigError(f"--episodes must be at least 1 (got {args.episodes})")
    if not 0.0 <= args.epsilon <= 1.0:
        raise ConfigError(f"--epsilon must be a probability from 0 to 1 (got {args.epsilon})")
    run_dir, cfg, policy, ckpt, _ = load_policy_for_eval(Path(args.target))
    if cfg.kind != "env":
        raise ConfigError(f"{run_dir.path} is an agent run; polar collect records env runs' policies")
    episodes = collect_episodes(policy, cfg.harness, args.episodes, seed=args.seed, deterministic=not args.stochastic,
                                epsilon=args.epsilon, config_dir=cfg.config_dir)
    from polar.harness import make_vector_env

    probe = make_vector_env(cfg.harness, 1, seed=args.seed, config_dir=cfg.config_dir)
    try:
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()
    env_id = getattr(cfg.harness, "id", None)
    out = write_dataset(args.out, episodes, obs_space, act_space, dataset_id=args.dataset_id, env_id=env_id,
                        algorithm_id=f"polar-{cfg.policy.type}", author="polar collect",
                        code_permalink=str(ckpt))
    import json

    meta = json.loads((out / "data" / "metadata.json").read_text())
    cli_console(stderr=False).print(f"wrote {meta['dataset_id']}: {meta['total_episodes']} episodes, {meta['total_steps']} steps "
                    f"-> {out}")
    return 0
