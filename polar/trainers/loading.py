"""Reopen a run directory: its resolved config (with the original config_dir) and its checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from polar.errors import RunDirError
from polar.trainers.run_dir import RunDir

if TYPE_CHECKING:
    import torch


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


def checkpoint_or_latest(run_dir: RunDir, ckpt: Path | None, fix: str = "") -> Path:
    """``ckpt`` (a checkpoint file the user named), else ``run_dir``'s latest; a run that has saved none is a
    ``RunDirError`` ending in ``fix``."""
    from polar.trainers.checkpoint import CheckpointManager

    found = ckpt or CheckpointManager(run_dir.checkpoints_dir).latest()
    if found is None:
        raise RunDirError(f"{run_dir.path} has no checkpoint yet{fix}")
    return found


def load_policy_for_eval(target: Path):
    """(run_dir, cfg, policy, checkpoint_path, state) for a run dir or a checkpoint file inside one."""
    from polar.harness import make_vector_env
    from polar.models.policy import build_policy
    from polar.trainers.checkpoint import load_checkpoint

    run_dir, cfg, ckpt = resolve_target(target)
    ckpt = checkpoint_or_latest(run_dir, ckpt, "; nothing to evaluate.")
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


def env_spaces(cfg, seed: int | None = None):
    """(observation space, action space) of an env run's harness, from a one-env probe."""
    from polar.harness import make_vector_env

    probe = make_vector_env(cfg.harness, 1, seed=seed, config_dir=cfg.config_dir)
    try:
        return probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()


def load_teacher(target: str, config_dir: Path, observation_space, action_space):
    """The frozen policy of the env run (folder: its latest checkpoint) or checkpoint ``target`` names, for
    ``policy.kwargs.teacher``. Its run must name no code (a run folder is data, as for ``polar eval`` without
    ``--trust-code``), and its env's spaces must be this run's: ``ConfigError`` in one line otherwise."""
    from polar.config.trust import code_references
    from polar.errors import ConfigError
    from polar.models.policy import build_policy
    from polar.trainers.checkpoint import load_checkpoint

    path = Path(target).expanduser()
    path = path if path.is_absolute() else config_dir / path
    key = f"policy.kwargs.teacher {target!r}"
    if not path.exists():
        raise ConfigError(f"{key}: {path} does not exist; give a polar env run folder or a checkpoint file in one")
    run_dir, cfg, ckpt = resolve_target(path)
    if not hasattr(cfg, "agent") or getattr(cfg.agent, "type", None) == "llm" or cfg.harness.type == "agent":
        raise ConfigError(f"{key}: {run_dir.path} is an LLM agent run; env distillation takes an env run's policy")
    refs = code_references(cfg)
    if refs:
        raise ConfigError(f"{key}: its run names code that loading it would run ({refs[0][0]} = {refs[0][1]!r}); "
                          "a teacher must be a run of built-in harnesses and agents")
    try:
        ckpt = checkpoint_or_latest(run_dir, ckpt)
    except RunDirError as e:
        raise ConfigError(f"{key}: {e}") from None
    teacher_obs, teacher_act = env_spaces(cfg, cfg.seed)
    if teacher_obs != observation_space or teacher_act != action_space:
        raise ConfigError(f"{key}: its spaces (observation {teacher_obs}, action {teacher_act}) differ from this "
                          f"run's (observation {observation_space}, action {action_space}); distil on the teacher's env")
    policy = build_policy(cfg, teacher_obs, teacher_act, cfg.config_dir)
    policy.load_state_dict(load_checkpoint(ckpt)["policy"])
    policy.eval()
    policy.requires_grad_(False)
    return policy


def is_run_target(path: Path) -> bool:
    """Whether ``path`` names a polar run: its folder (it holds ``config.resolved.yaml``) or a file in one (a
    checkpoint); an HF model folder holds ``config.json`` instead."""
    return path.is_file() or (path / "config.resolved.yaml").is_file()


def load_llm_run_model(target: Path, key: str) -> tuple[Any, torch.nn.Module]:
    """(tokenizer, model) of the LLM agent run folder ``target`` (its latest checkpoint) or checkpoint file: the
    run's own base model (its config's ``model.name_or_path``, loaded by the embedded engine), the checkpoint's
    weights in it, LoRA merged in (peft ``merge_and_unload``), fp32 on the CPU. Only tensors are read from the
    checkpoint (``weights_only``); none of the code the run names (harness, verifier) is imported, so a run of
    custom harnesses is as safe to load as a built-in one. ``key`` (the setting that named ``target``) opens every
    error, each one line."""
    from polar.config.run import AgentRunConfig
    from polar.errors import CheckpointError, ConfigError, RunDirError
    from polar.inference.base import EngineError
    from polar.inference.loading import load_engine
    from polar.models.llm_policy import LLMPolicy
    from polar.trainers.checkpoint import load_checkpoint

    try:
        run_dir, cfg, ckpt = resolve_target(target)
        if not isinstance(cfg, AgentRunConfig):
            raise ConfigError(f"{key}: {run_dir.path} is an env run (policy.type {cfg.policy.type}), not an LLM's; "
                              "the teacher is a preset, a local HF folder, or a polar GRPO or SFT run (folder or "
                              "checkpoint)")
        ckpt = checkpoint_or_latest(run_dir, ckpt, "; give a run that has saved one")
    except RunDirError as e:
        raise ConfigError(f"{key}: {e}") from None
    try:
        state = load_checkpoint(ckpt)
    except CheckpointError as e:
        raise ConfigError(f"{key}: {e}") from None
    if not isinstance(state.get("model"), dict):
        raise ConfigError(f"{key}: checkpoint {ckpt} holds no LLM weights ('model'); give a checkpoint of a GRPO or "
                          "SFT run")
    spec = cfg.model.name_or_path if cfg.model else cfg.gateway.model
    if cfg.model is not None and cfg.model.engine == "openai_compat":
        raise ConfigError(f"{key}: {run_dir.path} ran a hosted model (engine: openai_compat), which has no weights")
    folder = cfg.config_dir / spec  # a relative model folder is its run's config's, as the run itself read it
    spec = str(folder) if (folder / "config.json").is_file() else spec
    options: dict[str, Any] = {"seed": cfg.seed} if spec == "tiny" else {}  # tiny's weights are its seed's
    if "dtype" in cfg.gateway.engine_kwargs:
        options["dtype"] = cfg.gateway.engine_kwargs["dtype"]
    base_key = f"{key} (its run's model.name_or_path)"
    try:
        engine = load_engine(spec, config_key=base_key, **options)
    except EngineError as e:
        raise ConfigError(f"{base_key}: {e}" if base_key not in str(e) else str(e)) from None
    model = getattr(engine, "model", None)
    if model is None:
        raise ConfigError(f"{base_key}: {spec!r} is an upstream server; the teacher is rebuilt from the run's base "
                          "weights, so its model must be a preset or a local HF folder")
    lora = getattr(cfg.policy.kwargs, "lora", None)
    policy = LLMPolicy(model, engine.tokenizer, lora)  # the engine is this function's: its model is reused
    try:
        policy.load_state_dict(state["model"])
    except RuntimeError as e:
        detail = " ".join(line.strip() for line in str(e).splitlines()[1:]) or type(e).__name__
        raise ConfigError(f"{key}: checkpoint {ckpt} does not fit its run's model {spec!r} "
                          f"(lora {'r ' + str(lora.r) if lora else 'none'}): {detail[:240]}") from None
    merged: torch.nn.Module = policy.model.merge_and_unload() if lora is not None else policy.model
    return engine.tokenizer, merged
