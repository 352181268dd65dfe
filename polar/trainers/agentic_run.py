"""``polar run`` for ``harness.type == agent``: optional SFT warm-up, then GRPO (or SFT alone).

Everything runs in this process: the embedded engine behind an in-process gateway, the rollout service
with its session pipeline, and the learner. The run directory holds the usual ``config.resolved.yaml``,
``metrics.jsonl``, ``tb/``, ``checkpoints/`` and ``eval/``, plus ``gateway/sessions/`` (every call).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from polar.errors import ConfigError
from polar.harness.agent.tasks import resolve
from polar.harness.sessions import agent_timeout_s, session_runner, session_verifier
from polar.harness.sessions import load_run_tasks as load_tasks
from polar.rollout.sessions.local import LocalStack
from polar.rollout.sessions.pipeline import PipelineSettings

log = logging.getLogger(__name__)


def pipeline_settings(cfg: Any, workspace_root: Path | None = None) -> PipelineSettings:
    s, h = cfg.sessions, cfg.harness
    template = str(resolve(h.cwd, cfg.config_dir)) if getattr(h, "cwd", None) else None
    if template and not Path(template).is_dir():
        raise ConfigError(f"harness.cwd {h.cwd!r} is not a directory (resolved next to the config: {template})")
    return PipelineSettings(
        max_init_workers=s.max_init_workers, max_run_workers=s.max_run_workers, max_postrun_workers=s.max_postrun_workers,
        session_budget_s=s.session_budget_s, agent_timeout_s=agent_timeout_s(cfg),
        verifier_timeout_s=cfg.verifier.timeout_s if cfg.verifier else 60.0, builder=cfg.trajectory.builder,
        workspace_root=s.workspace_root or (str(workspace_root) if workspace_root else None), template_dir=template,
        keep_workspaces=s.keep_workspaces, max_node_retries=s.max_node_retries, node_wait_s=s.node_wait_s,
    )


def build_stack(cfg: Any, run_dir_path: Path, engine: Any = None, records_dir: Path | None = None) -> LocalStack:
    """Engine + gateway + rollout service for ``cfg`` (not started); calls are recorded in ``records_dir``
    (default: the run's ``gateway/sessions/``)."""
    from polar.inference import load_engine

    # runner, verifier and settings first: a bad harness fails before minutes of engine start
    runner = session_runner(cfg)  # a ConfigError when cfg is no agent run
    verifier = session_verifier(cfg)
    settings = pipeline_settings(cfg, run_dir_path / "workspaces")
    owned = engine is None
    if engine is None:
        spec = cfg.model.name_or_path if cfg.model else cfg.gateway.model
        # polar launches and supervises vLLM (model: {engine: vllm}, or a gateway section asking for it)
        launched = cfg.model if cfg.model is not None else cfg.gateway
        chat_template = (cfg.model.chat_template if cfg.model else None) or cfg.gateway.chat_template
        if chat_template and chat_template.removeprefix("builtin:") not in ("model", "hermes-tools"):
            chat_template = str(resolve(chat_template, cfg.config_dir))  # a file, next to the config
        if launched.engine != "embedded":
            engine = load_engine(spec, engine=launched.engine, replicas=launched.replicas,
                                 log_dir=str(run_dir_path / "vllm"), **launched.engine_kwargs,
                                 config_key="model.name_or_path" if cfg.model else "gateway.model",
                                 chat_template=chat_template)
        else:
            engine = load_engine(spec, **({"seed": cfg.seed} if spec == "tiny" else {}), **cfg.gateway.engine_kwargs,
                                 config_key="model.name_or_path" if cfg.model else "gateway.model",
                                 chat_template=chat_template)
    gateway_cfg = cfg.gateway.model_copy(update={"resume_records": True, "chat_template": None})  # the run's own records: resume, eval continue
    try:
        return LocalStack(engine, runner, verifier, settings, records_dir=records_dir or run_dir_path / "gateway" / "sessions",
                          gateway_config=gateway_cfg, results_dir=run_dir_path / "sessions")
    except BaseException:
        if owned:  # a launched vLLM must not outlive a stack that never started
            import asyncio

            asyncio.run(engine.close())
        raise


def heldout_success(stack: Any, eval_tasks: list[dict[str, Any]], samples: int, tag: str) -> dict[str, float]:
    """``samples`` sessions of every held-out task with the engine's current weights; success rate and counts."""
    from polar.trainers.llm_trainer import success_rate

    return success_rate(stack.run_groups([(t, samples, {"eval": tag}) for t in eval_tasks]))


def evaluate_agent_run(run_dir: Any, cfg: Any, checkpoint: Path | None = None, samples: int | None = None,
                       engine: Any = None) -> dict[str, Any]:
    """``polar eval`` for an agent run: its ``eval_tasks`` with the weights of ``checkpoint`` (default: the
    latest), through the same stack and success measure as the held-out evaluation that ends ``polar run``."""
    from polar.errors import RunDirError
    from polar.models.llm_policy import LLMPolicy
    from polar.trainers.checkpoint import CheckpointManager, load_checkpoint

    if not cfg.eval_tasks:
        raise ConfigError(
            f"{run_dir.path} has no eval_tasks, so nothing is held out to evaluate; add 'eval_tasks: FILE.jsonl' "
            f"to {run_dir.config_path} and run `polar eval {run_dir.path}` again"
        )
    eval_tasks = load_tasks(cfg.eval_tasks, cfg.config_dir)
    ckpt = checkpoint or CheckpointManager(run_dir.checkpoints_dir).latest()
    if ckpt is None:
        raise RunDirError(f"{run_dir.path} has no checkpoint yet; nothing to evaluate.")
    state = load_checkpoint(ckpt)
    if "model" not in state:
        raise RunDirError(f"checkpoint {ckpt} holds no LLM weights ('model'); it was not written by an agent run")
    kw = cfg.policy.kwargs
    samples = samples or getattr(kw, "eval_samples", 1)
    tag = f"eval_{Path(ckpt).stem}_{time.strftime('%Y%m%d-%H%M%S')}"
    # this evaluation's calls go to a folder of their own, never into the training records
    records = run_dir.eval_dir / "sessions" / tag
    n = 1
    while records.exists():
        n += 1
        records = run_dir.eval_dir / "sessions" / f"{tag}-{n}"
    with build_stack(cfg, run_dir.path, engine, records_dir=records) as stack:
        policy = LLMPolicy.from_engine(stack.engine, getattr(kw, "lora", None), **policy_options(cfg))
        policy.load_state_dict(state["model"])
        stack.update_weights(policy.serving_state_dict(), int(state.get("policy_version", 0)))
        res: dict[str, Any] = heldout_success(stack, eval_tasks, samples, tag)
    res.update(checkpoint=str(ckpt), step=int(state.get("step", 0)), samples_per_task=samples,
               policy_version=int(state.get("policy_version", 0)), records=str(records))
    return res


def policy_options(cfg: Any) -> dict[str, Any]:
    """``LLMPolicy`` options from a run config: the learner's device (``distribution.num_gpus``), and the
    ``policy.kwargs`` autocast and gradient checkpointing switches."""
    from polar.trainers.device import learner_device

    kw = cfg.policy.kwargs
    return {"device": learner_device(cfg.distribution.num_gpus), "autocast": getattr(kw, "autocast", "off"),
            "gradient_checkpointing": getattr(kw, "gradient_checkpointing", False)}


def heldout_table(title: str, rows: dict[str, dict[str, Any]]) -> Any:
    """The held-out success table ``polar run`` and ``polar eval`` print, one row per evaluated stage."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("stage", "success", "sessions", "errors"):
        table.add_column(col)
    for stage, e in rows.items():
        table.add_row(stage, f"{e['success']:.3f}", str(e["sessions"]), str(e["errors"]))
    return table


def train_agentic(cfg: Any, run_dir: Any, resume: bool = False, engine: Any = None) -> dict[str, Any]:
    """The whole run; returns a summary (also written to ``eval/summary.json``). ``run.json`` records this
    process as the run's owner and the run's final status, however it ends (``polar.trainers.lifecycle``)."""
    from polar.trainers.lifecycle import run_guard

    with run_guard(run_dir, cfg.logging.sigterm_grace_s):
        return _train_agentic(cfg, run_dir, resume, engine)


def _train_agentic(cfg: Any, run_dir: Any, resume: bool = False, engine: Any = None) -> dict[str, Any]:
    from polar.config import dump_config
    from polar.metrics.logger import MetricsLogger
    from polar.models.llm_policy import LLMPolicy, load_demonstrations
    from polar.trainers.checkpoint import CheckpointManager
    from polar.trainers.lifecycle import deferred_stop
    from polar.trainers.llm_trainer import GRPOTrainer, sft_train

    policy_cfg = cfg.policy
    if policy_cfg.type not in ("grpo", "sft"):
        raise ConfigError(f"policy.type {policy_cfg.type!r}: agent harnesses train with 'grpo' or 'sft'")
    if policy_cfg.type == "grpo" and not cfg.tasks:
        raise ConfigError("policy grpo needs 'tasks: FILE.jsonl' (the prompts to roll out)")
    if not resume:
        run_dir.write_config(dump_config(cfg))
    run_dir.update_meta(status="running", kind=f"agentic-{policy_cfg.type}")
    logger = MetricsLogger(run_dir.metrics_path, run_dir.tensorboard_dir if cfg.logging.tensorboard else None)
    checkpoints = CheckpointManager(run_dir.checkpoints_dir, cfg.logging.keep_checkpoints)
    eval_tasks = load_tasks(cfg.eval_tasks, cfg.config_dir) if cfg.eval_tasks else []
    summary: dict[str, Any] = {}
    t0 = time.monotonic()
    stack = build_stack(cfg, run_dir.path, engine)
    with stack:
        kw = policy_cfg.kwargs
        policy = LLMPolicy.from_engine(stack.engine, kw.lora, **policy_options(cfg))
        latest = checkpoints.latest() if resume else None

        def evaluate(tag: str, samples: int = 1) -> dict[str, Any]:
            if not eval_tasks:
                return {}
            res = heldout_success(stack, eval_tasks, samples, tag)
            run_dir.write_json(f"eval/{tag}.json", res)
            log.info("held-out success (%s): %.3f over %d sessions", tag, res["success"], res["sessions"])
            return res

        sft = cfg.sft_warmup
        demos_path = sft.demonstrations if sft else (cfg.tasks if policy_cfg.type == "sft" else None)
        sft_kwargs = sft.kwargs if sft else (kw if policy_cfg.type == "sft" else None)
        version = int(stack.engine.policy_version)
        if demos_path and latest is None:
            if policy_cfg.type == "grpo" and sft_kwargs.lora is not None and kw.lora is None:
                raise ConfigError("sft_warmup.kwargs.lora is set but policy.kwargs.lora is not; use the same for both")
            demos = load_demonstrations(resolve(demos_path, cfg.config_dir), policy.tokenizer)
            ts = time.monotonic()
            losses = sft_train(policy, demos, sft_kwargs, cfg.seed,
                               on_step=lambda s, loss: logger.log({"sft_step": s, "sft_loss": loss}, s) if s % 10 == 0 else None)
            version += 1
            stack.update_weights(policy.serving_state_dict(), version)
            summary["sft"] = {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1],
                              "demonstrations": len(demos), "time_s": round(time.monotonic() - ts, 1)}
            log.info("SFT: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])
        if policy_cfg.type == "sft":
            checkpoints.save(0, {"model": policy.state_dict(), "step": 0, "policy_version": version})
            summary["eval_final"] = evaluate("final", getattr(kw, "eval_samples", 1))
        else:
            summary["eval_before"] = evaluate("before_grpo", kw.eval_samples)
            trainer = GRPOTrainer(stack, policy, kw, load_tasks(cfg.tasks, cfg.config_dir), eval_tasks, logger,
                                  checkpoints, cfg.logging.checkpoint_freq, cfg.seed, version=version)
            if latest is not None:
                from polar.trainers.checkpoint import load_checkpoint

                trainer.load_state(load_checkpoint(latest))
            tg = time.monotonic()
            with deferred_stop():  # Ctrl-C / SIGTERM: the GRPO step ends and is checkpointed first
                result = trainer.train()
            summary["grpo"] = {"steps": result["steps"], "time_s": round(time.monotonic() - tg, 1)}
            summary["eval_after"] = evaluate("after_grpo", kw.eval_samples)
            history = result["history"]
            if history:
                summary["grpo"]["reward_first"] = history[0]["reward_mean"]
                summary["grpo"]["reward_last"] = history[-1]["reward_mean"]
    summary["time_s"] = round(time.monotonic() - t0, 1)
    logger.close()
    run_dir.write_json("eval/summary.json", summary)
    run_dir.update_meta(status="finished", result={k: v for k, v in summary.items() if k != "history"})
    return summary


def run_from_cli(cfg: Any, args: Any) -> int:
    """``polar run`` for agent harnesses: create the run dir, train, print the held-out numbers."""
    from rich.console import Console

    from polar.config.llm_agent import is_agent_run
    from polar.trainers.run_dir import RunDir

    if not is_agent_run(cfg) or cfg.policy.type not in ("grpo", "sft"):
        raise ConfigError(
            f"harness.type {cfg.harness.type!r} with policy.type {cfg.policy.type!r}: agent harnesses train with "
            "grpo or sft, and grpo/sft need harness.type: agent"
        )
    console = Console(stderr=True)
    run_dir = RunDir.create(cfg.name, args.run_dir, kind=f"agentic-{cfg.policy.type}", config_dir=cfg.config_dir)
    console.print(f"[bold]run dir[/]: {run_dir.path}")
    summary = train_agentic(cfg, run_dir)
    rows = {key.removeprefix("eval_"): summary[key] for key in ("eval_before", "eval_after", "eval_final")
            if summary.get(key)}
    if rows:
        console.print(heldout_table(f"{cfg.name}: held-out success", rows))
    else:
        console.print("no held-out tasks: the config sets no eval_tasks, so held-out success was not measured "
                      "(add 'eval_tasks: FILE.jsonl' to measure it)")
    return 0
