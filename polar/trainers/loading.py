"""Reopen a run directory: its resolved config (with the original config_dir) and its checkpoints."""

from __future__ import annotations

from pathlib import Path

from polar.errors import RunDirError
from polar.trainers.run_dir import RunDir


def load_run(path: str | Path, overrides: list[str] | None = None):
    """(RunDir, RunConfig) for an existing run; user modules resolve where the original config lived.

    ``overrides`` (``polar resume -o key.path=value``) apply to the resolved config and are validated by the
    same models as ``polar run -o``."""
    from polar.config import load_config

    run_dir = RunDir.open(path)
    if not run_dir.config_path.is_file():
        raise RunDirError(f"{run_dir.path} has no config.resolved.yaml; it was not started by `polar run`.")
    cfg = load_config(run_dir.config_path, overrides)
    meta = run_dir.read_meta()
    if meta.get("config_dir"):
        cfg._config_dir = Path(meta["config_dir"])
    return run_dir, cfg


def resolve_target(target: Path):
    """(run_dir, cfg, checkpoint or None) for a run dir, or a checkpoint file inside one."""
    target = Path(target)
    if target.is_file():
        ckpt = target
        run_path = target.parent.parent if target.parent.name == "checkpoints" else target.parent
    else:
        run_path = target
        ckpt = None
    run_dir, cfg = load_run(run_path)
    return run_dir, cfg, ckpt


def load_policy_for_eval(target: Path):
    """(run_dir, cfg, policy, checkpoint_path, state) for a run dir or a checkpoint file inside one."""
    from polar.harness import make_vector_env
    from polar.models.policy import build_policy
    from polar.trainers.checkpoint import CheckpointManager, load_checkpoint

    run_dir, cfg, ckpt = resolve_target(target)
    if ckpt is None:
        ckpt = CheckpointManager(run_dir.checkpoints_dir).latest()
        if ckpt is None:
            raise RunDirError(f"{run_dir.path} has no checkpoint yet; nothing to evaluate.")
    state = load_checkpoint(ckpt)
    policies = state.get("policies")
    if "policy" not in state and isinstance(policies, dict) and "manager" in policies:  # a hierarchical run
        raise RunDirError(f"{run_dir.path} is a {cfg.policy.type} run: its checkpoint holds a manager and skills, not "
                          "one policy, so it cannot be exported, served or recorded; evaluate it with polar eval "
                          "(docs/hierarchy.md)")
    probe = make_vector_env(cfg.harness, 1, seed=cfg.eval.seed, config_dir=cfg.config_dir)
    try:
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()
    policy = build_policy(cfg, obs_space, act_space, cfg.config_dir)
    policy.load_state_dict(state["policy"])
    policy.eval()
    return run_dir, cfg, policy, ckpt, state
