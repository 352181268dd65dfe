"""Agent runs (``harness.type: agent``, or the LLM agent on an env harness): the agent stack builder. An agent
run is the one loop (``polar.trainers.loop.TrainingLoop``) composed here of

- the rollout stack (``build_stack``: engine, gateway, rollout service, in this process; ``build_ray_stack``:
  sessions on Ray gateway nodes, the learner actor's), started for the run and closed after its final
  evaluation;
- a collector: ``polar.rollout.sessions.collector.SessionCollector`` (``tasks_per_step`` groups of
  ``group_size`` sessions, dynamic sampling, the difficulty filter and curriculum, checkpointed with the run);
- a learner: ``polar.algorithms.grpo.GRPOLearner`` (one GRPO step per iteration: group-relative advantages,
  the clipped update against the engine's recorded logprobs, weights to the engine through the gateway's
  drain) or ``polar.algorithms.sft.SFTLearner``;
- a warm-up stage: SFT on demonstrations (``sft_warmup``, or the whole of a ``policy.type: sft`` run, whose
  checkpoint is then ``ckpt_00000000.pt``) through ``DemonstrationCollector`` and ``SFTLearner``, logged as
  ``sft/...`` rows, one new policy version the engine gets before the first session;
- an evaluator (``AgentEvaluator``): held-out success over ``eval_tasks`` before GRPO (after the warm-up),
  every ``eval_every`` steps, and at the end (``eval/summary.json``).

The run directory holds the usual ``config.resolved.yaml``, ``metrics.jsonl``, ``tb/``, ``checkpoints/`` and
``eval/``, plus ``gateway/sessions/`` (every call). The metrics rows carry the loop's names (``iteration``,
``env_steps``: sessions so far, ``episode_reward_mean``: the step's sessions, ``pg_loss``) and, for tools
that read agent runs, ``step`` and ``reward_mean``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from polar.config.gateway import ActionCacheConfig
from polar.config.grpo import GRPOKwargs
from polar.config.harness import AgentHarnessConfig
from polar.config.run import AgentRunConfig, RunConfig
from polar.errors import ConfigError
from polar.harness.agent.tasks import resolve
from polar.harness.sessions import agent_timeout_s, session_runner, session_verifier
from polar.harness.sessions import load_run_tasks as load_tasks
from polar.rollout.sessions.collector import SessionStack
from polar.rollout.sessions.stats import success_rate
from polar.trainers.run_dir import RunDir
from polar.types import Collector, Evaluator, Learner, Metrics, Progress

if TYPE_CHECKING:  # torch and the loop load when a run is built, not when a config is checked (polar run's preflight)
    from polar.models.llm_policy import LLMPolicy
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings
    from polar.rollout.sessions.ray_nodes import RaySessionStack
    from polar.trainers.loop import Budget, OnIteration, Stage, TrainingLoop

log = logging.getLogger(__name__)


RUN_WORKERS_PROGRAM, RUN_WORKERS_IN_PROCESS = 8, 32


def run_workers(cfg: AgentRunConfig) -> int:
    """``sessions.max_run_workers``, or its default: a session that is one program (a CLI, an agent command)
    costs a process and its memory, so 8 run at once; an in-process session costs a coroutine and spends its
    time waiting on the engine, whose batch (32 in the embedded engine) is then what bounds the throughput."""
    if cfg.sessions.max_run_workers is not None:
        return cfg.sessions.max_run_workers
    h = cfg.harness
    if isinstance(h, AgentHarnessConfig) and (h.command or h.preset):
        return RUN_WORKERS_PROGRAM
    return RUN_WORKERS_IN_PROCESS


def pipeline_settings(cfg: AgentRunConfig, workspace_root: Path | None = None) -> PipelineSettings:
    from polar.rollout.sessions.pipeline import PipelineSettings  # here: env runs import this module too

    s = cfg.sessions
    cwd = getattr(cfg.harness, "cwd", None)  # an agent harness's workspace template
    template = str(resolve(cwd, cfg.config_dir)) if cwd else None
    if template and not Path(template).is_dir():
        raise ConfigError(f"harness.cwd {cwd!r} is not a directory (resolved next to the config: {template})")
    return PipelineSettings(
        max_init_workers=s.max_init_workers, max_run_workers=run_workers(cfg), max_postrun_workers=s.max_postrun_workers,
        session_budget_s=s.session_budget_s, agent_timeout_s=agent_timeout_s(cfg),
        verifier_timeout_s=cfg.verifier.timeout_s if cfg.verifier else 60.0, builder=cfg.trajectory.builder,
        workspace_root=s.workspace_root or (str(workspace_root) if workspace_root else None), template_dir=template,
        keep_workspaces=s.keep_workspaces, max_node_retries=s.max_node_retries, node_wait_s=s.node_wait_s,
    )


class EmbeddedEngineFactory:
    """Builds the run's embedded engine (picklable: each Ray gateway node builds its own from it), with the
    run's rollout sampling applied to every call when ``sampling`` is given (``rollout_sampling``)."""

    def __init__(self, spec: str, kwargs: dict[str, Any],
                 sampling: tuple[float | None, int | None] = (None, None)) -> None:
        self.spec, self.kwargs, self.sampling = spec, dict(kwargs), sampling

    def __call__(self) -> Any:
        from polar.inference import load_engine
        from polar.inference.rollout_sampling import with_rollout_sampling

        return with_rollout_sampling(load_engine(self.spec, **self.kwargs), *self.sampling)


class LaunchedVllmFactory:
    """Launches the run's vLLM replicas inside a Ray gateway node and returns an engine over them (picklable:
    each node builds its own). Every node owns and supervises ``replicas`` servers, its logs under
    ``<log_dir>/node-<pid>/``; weight syncs reach them through that node's gateway."""

    def __init__(self, spec: str, replicas: int, engine_kwargs: dict[str, Any], log_dir: Path, config_key: str,
                 chat_template: str | None, sampling: tuple[float | None, int | None] = (None, None)) -> None:
        self.spec, self.replicas, self.engine_kwargs = spec, replicas, dict(engine_kwargs)
        self.log_dir, self.config_key, self.chat_template, self.sampling = log_dir, config_key, chat_template, sampling

    def __call__(self) -> Any:
        import os

        from polar.inference import load_engine
        from polar.inference.rollout_sampling import with_rollout_sampling

        engine = load_engine(self.spec, engine="vllm", replicas=self.replicas,
                             log_dir=str(self.log_dir / f"node-{os.getpid()}"), config_key=self.config_key,
                             chat_template=self.chat_template, **self.engine_kwargs)
        return with_rollout_sampling(engine, *self.sampling)


def rollout_sampling(cfg: AgentRunConfig) -> tuple[float | None, int | None]:
    """``(temperature, max_tokens)`` every model call of a training session samples with (the config's
    ``policy.kwargs``, resolved by ``AgentRunConfig``); ``(None, None)`` for SFT, which samples nothing."""
    kw = cfg.policy.kwargs
    return (kw.temperature, kw.max_tokens) if isinstance(kw, GRPOKwargs) else (None, None)


def _chat_template(cfg: AgentRunConfig) -> str | None:
    chat_template = (cfg.model.chat_template if cfg.model else None) or cfg.gateway.chat_template
    if chat_template and chat_template.removeprefix("builtin:") not in ("model", "hermes-tools"):
        chat_template = str(resolve(chat_template, cfg.config_dir))  # a file, next to the config
    return chat_template


def _model_spec(cfg: AgentRunConfig) -> tuple[str, str, Any]:
    """``(spec, config key, the section that may ask polar to launch an engine)``."""
    if cfg.model:
        return cfg.model.name_or_path, "model.name_or_path", cfg.model
    return cfg.gateway.model, "gateway.model", cfg.gateway


def launched_engine_kwargs(cfg: AgentRunConfig, launched: Any) -> dict[str, Any]:
    """The launch options of the vLLM replicas polar starts: a LoRA run that syncs adapters only
    (``gateway.sync.lora: adapters``, the default) gets ``max_lora_rank: lora.r`` unless the config names one,
    since polar launches them and knows the rank (a replica without ``--enable-lora`` could not take them)."""
    kwargs = dict(launched.engine_kwargs)
    lora = getattr(cfg.policy.kwargs, "lora", None)
    if lora is not None and cfg.gateway.sync.lora == "adapters" and kwargs.get("max_lora_rank") is None:
        kwargs["max_lora_rank"] = int(lora.r)
    return kwargs


def embedded_engine_factory(cfg: AgentRunConfig, training: bool = False) -> EmbeddedEngineFactory:
    spec, key, _ = _model_spec(cfg)
    return EmbeddedEngineFactory(spec, {**({"seed": cfg.seed} if spec == "tiny" else {}), **cfg.gateway.engine_kwargs,
                                        "config_key": key, "chat_template": _chat_template(cfg)},
                                 rollout_sampling(cfg) if training else (None, None))


def engine_of_model_section(section: Any, key: str) -> Any:
    """An engine from a model section given inline (a judge's ``judge:``, an evaluation suite's ``model:``):
    ``engine: openai_compat`` (a chat endpoint) or ``embedded`` (a local model); ``key`` names it in errors."""
    from polar.config.agentic import ModelConfig
    from polar.config.base import validate
    from polar.inference import load_engine

    m = validate(ModelConfig, section, source=key)
    if m.engine == "openai_compat":
        return load_engine(m.model, engine="openai_compat", config_key=key, **m.openai_compat_options())
    if m.engine == "embedded":
        return load_engine(m.name_or_path, config_key=f"{key}.name_or_path", chat_template=m.chat_template,
                           **m.engine_kwargs)
    raise ConfigError(f"{key}.engine {m.engine!r}: here a model runs on engine: embedded (a local model) or "
                      "openai_compat (any chat endpoint, a vLLM server included)")


def attach_judge(verifier: Any, run_dir_path: Path) -> Any:
    """Give an ``llm_judge`` verifier its engine (``verifier.kwargs.judge``, any model section: openai_compat
    or a local model) as a chat function, and its log folder ``<run dir>/judge/`` (one JSONL per session).
    Other verifiers are returned as they are."""
    from polar.harness.agent.judge import LLMJudge
    from polar.harness.agent.verifiers import CheckedVerifier

    judge = verifier.inner if isinstance(verifier, CheckedVerifier) else verifier  # the reward check wraps it
    if not isinstance(judge, LLMJudge) or judge.chat is not None:
        return verifier
    from polar.inference.chat import chat_function

    engine = engine_of_model_section(judge.judge_spec, "verifier.kwargs.judge")
    judge.chat = chat_function(engine, judge.max_tokens, judge.temperature)
    judge.log_dir = run_dir_path / "judge"
    return verifier


def build_stack(cfg: AgentRunConfig, run_dir_path: Path, engine: Any = None, records_dir: Path | None = None,
                training: bool = False, greedy: bool = False, action_cache: ActionCacheConfig | None = None) -> LocalStack:
    """Engine + gateway + rollout service for ``cfg`` (not started); calls are recorded in ``records_dir``
    (default: the run's ``gateway/sessions/``). ``training``: a run's own stack, whose every model call
    samples with the run's ``policy.kwargs.temperature`` and ``max_tokens`` (``rollout_sampling``); other
    users (``polar generate``, evaluation suites) keep what the agent, or their own engine wrapper, asks.
    ``greedy``: every call at temperature 0 (``polar eval --greedy``); ``action_cache``: the gateway's action
    cache (``polar eval --action-cache``; never in training)."""
    if training and action_cache is not None:
        raise ConfigError("the action cache is for evaluation and serving; a training run samples fresh answers")
    # here, not at the top: uvicorn, starlette and httpx load for agent runs only (env runs import this module)
    from polar.inference import load_engine
    from polar.inference.rollout_sampling import with_rollout_sampling
    from polar.rollout.sessions.local import LocalStack

    # runner, verifier and settings first: a bad harness fails before minutes of engine start
    runner = session_runner(cfg)  # a ConfigError when cfg is no agent run
    verifier = attach_judge(session_verifier(cfg), run_dir_path)
    settings = pipeline_settings(cfg, run_dir_path / "workspaces")
    owned = engine is None
    if engine is None:
        spec, key, launched = _model_spec(cfg)
        if launched.engine == "openai_compat":  # a chat endpoint: the gateway forwards messages to it
            engine = load_engine(launched.model, engine="openai_compat", config_key="model",
                                 chat_template=_chat_template(cfg), **launched.openai_compat_options())
        # polar launches and supervises vLLM (model: {engine: vllm}, or a gateway section asking for it)
        elif launched.engine != "embedded":
            engine = load_engine(spec, engine=launched.engine, replicas=launched.replicas,
                                 log_dir=str(run_dir_path / "vllm"), **launched_engine_kwargs(cfg, launched),
                                 config_key=key, chat_template=_chat_template(cfg))
        else:
            engine = embedded_engine_factory(cfg)()
    if training:
        engine = with_rollout_sampling(engine, *rollout_sampling(cfg))
    elif greedy:
        engine = with_rollout_sampling(engine, 0.0, None)
    gateway_cfg = cfg.gateway.model_copy(update={"resume_records": True, "chat_template": None,  # the run's own records: resume, eval continue
                                                 "action_cache": action_cache})
    try:
        return LocalStack(engine, runner, verifier, settings, records_dir=records_dir or run_dir_path / "gateway" / "sessions",
                          gateway_config=gateway_cfg, results_dir=run_dir_path / "sessions")
    except BaseException:
        if owned:  # a launched vLLM must not outlive a stack that never started
            import asyncio

            asyncio.run(engine.close())
        raise


def trained_engine_problem(cfg: RunConfig) -> str | None:
    """Why ``cfg``'s engine cannot be the trained policy (None: it can, or ``cfg`` is an env run): a remote chat
    endpoint has no weights."""
    if not isinstance(cfg, AgentRunConfig):
        return None
    model = cfg.model
    if model is not None and model.engine == "openai_compat":
        return (f"model.engine: openai_compat ({model.base_url}) serves a remote model with no weights to update, "
                f"so policy.type {cfg.policy.type} cannot train it; use it with polar generate or as a judge, and "
                "train a local model (model.engine: embedded or vllm)")
    return None


def ray_engine_problem(cfg: AgentRunConfig) -> str | None:
    """Why ``cfg``'s engine cannot run on Ray gateway nodes (None: it can). Each node builds its own engine:
    the embedded one, or (``engine: vllm``) its own launched vLLM replicas; an external server URL or a
    chat endpoint is one shared thing per run, which the nodes cannot each own."""
    spec, key, launched = _model_spec(cfg)
    section = key.split(".")[0]
    if launched.engine not in ("embedded", "vllm"):
        return (f"{section}.engine is {launched.engine!r}, but with distribution.backend: ray every gateway node builds "
                f"its own engine (embedded, or vllm replicas it launches); set {section}.engine: embedded or vllm, "
                "or distribution.backend: local")
    if isinstance(spec, str) and ":" in spec.split("/")[0] and spec.split(":", 1)[0] in ("vllm", "sglang"):
        return (f"{key} {spec!r} names external servers, but with distribution.backend: ray every gateway node "
                f"builds its own engine; name a model (preset or folder), or set distribution.backend: local")
    return None


def build_ray_stack(cfg: AgentRunConfig, run_dir_path: Path, engine: Any = None, records_dir: Path | None = None,
                    training: bool = False) -> RaySessionStack:
    """The rollout stack of an agent run with ``distribution.backend: ray`` (not started): this process runs
    the rollout service and keeps a local engine the learner is built from; ``max(1, rollout_workers)``
    gateway nodes, each building the same embedded engine inside its Ray actor, are placed with
    ``distribution.gateway_resources`` (``SPREAD`` over the cluster). Records and finished sessions go to the
    run directory, as with the local stack."""
    from polar.rollout.sessions.ray_nodes import RaySessionStack

    problem = ray_engine_problem(cfg)
    if problem is not None:
        raise ConfigError(problem)
    runner = session_runner(cfg)
    verifier = attach_judge(session_verifier(cfg), run_dir_path)
    settings = pipeline_settings(cfg, run_dir_path / "workspaces")
    spec, key, launched = _model_spec(cfg)
    factory: EmbeddedEngineFactory | LaunchedVllmFactory = embedded_engine_factory(cfg, training)
    if launched.engine == "vllm":  # every node launches and supervises its own replicas
        factory = LaunchedVllmFactory(spec, launched.replicas, launched_engine_kwargs(cfg, launched), run_dir_path / "vllm",
                                      key, _chat_template(cfg), rollout_sampling(cfg) if training else (None, None))
    # the learner's copy: the embedded engine of the same spec and seed as the nodes' (the same weights); with
    # engine: vllm the same folder, loaded here rather than served
    local = engine if engine is not None else embedded_engine_factory(cfg)()
    d = cfg.distribution
    res = d.gateway_resources
    gateway_cfg = cfg.gateway.model_dump(mode="json", exclude={"host", "port"})
    gateway_cfg.update(resume_records=True, chat_template=None)
    return RaySessionStack(local, factory, runner, verifier, settings, num_nodes=max(1, d.rollout_workers),
                           num_cpus=res.num_cpus, num_gpus=res.num_gpus, resources=dict(res.resources),
                           gateway_cfg=gateway_cfg, start_timeout_s=max(d.connect_timeout_s, 300.0),
                           records_dir=records_dir or run_dir_path / "gateway" / "sessions",
                           results_dir=run_dir_path / "sessions")


EVAL_HEARTBEAT_S = 30.0  # a held-out evaluation in progress says how far it is this often


def heldout_success(stack: SessionStack, eval_tasks: list[dict[str, Any]], samples: int, tag: str) -> dict[str, float]:
    """``samples`` sessions of every held-out task with the engine's current weights; success rate and counts.
    While it runs (hundreds of sessions take minutes) a line every ``EVAL_HEARTBEAT_S`` says how many finished."""
    import concurrent.futures

    from polar.rollout.sessions.stats import live_counts

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="polar-eval") as pool:
        future = pool.submit(stack.run_groups, [(t, samples, {"eval": tag}) for t in eval_tasks])
        while True:
            try:
                return success_rate(future.result(timeout=EVAL_HEARTBEAT_S))
            except concurrent.futures.TimeoutError:
                c = live_counts(stack, lambda m: m.get("eval") == tag)
                done = "" if c is None else f", {c.finished}/{c.sessions} sessions finished"
                log.info("held-out evaluation (%s): running%s, %.0fs", tag, done, time.monotonic() - t0)


def evaluate_agent_run(run_dir: RunDir, cfg: AgentRunConfig, checkpoint: Path | None = None, samples: int | None = None,
                       engine: Any = None, greedy: bool = False, action_cache: ActionCacheConfig | None = None) -> dict[str, Any]:
    """``polar eval`` for an agent run: its ``eval_tasks`` with the weights of ``checkpoint`` (default: the
    latest), through the same stack and success measure as the held-out evaluation that ends ``polar run``.
    ``greedy``: every call at temperature 0; ``action_cache``: replay repeated greedy prompts (the result's
    ``action_cache`` holds the hit rate); without ``greedy`` the LLM agent's own temperature must be 0."""
    from polar.errors import RunDirError
    from polar.models.llm_policy import LLMPolicy
    from polar.trainers.checkpoint import CheckpointManager, load_checkpoint

    if not cfg.eval_tasks:
        raise ConfigError(
            f"{run_dir.path} has no eval_tasks, so nothing is held out to evaluate; add 'eval_tasks: FILE.jsonl' "
            f"to {run_dir.config_path} and run `polar eval {run_dir.path}` again"
        )
    if action_cache is not None and not greedy and cfg.agent is not None and cfg.agent.temperature != 0:
        raise ConfigError(f"--action-cache replays greedy answers only, and {run_dir.config_path} sets agent.temperature: "
                          f"{cfg.agent.temperature:g}; add --greedy (every call at temperature 0) or drop --action-cache")
    eval_tasks = load_tasks(cfg.eval_tasks, cfg.config_dir)
    ckpt = checkpoint or CheckpointManager(run_dir.checkpoints_dir).latest()
    if ckpt is None:
        raise RunDirError(f"{run_dir.path} has no checkpoint yet; nothing to evaluate.")
    state = load_checkpoint(ckpt)
    if "model" not in state:
        raise RunDirError(f"checkpoint {ckpt} holds no LLM weights ('model'); it was not written by an agent run")
    kw = cfg.policy.kwargs
    samples = samples or (kw.eval_samples if isinstance(kw, GRPOKwargs) else 1)
    tag = f"eval_{Path(ckpt).stem}_{time.strftime('%Y%m%d-%H%M%S')}"
    # this evaluation's calls go to a folder of their own, never into the training records
    records = run_dir.eval_dir / "sessions" / tag
    n = 1
    while records.exists():
        n += 1
        records = run_dir.eval_dir / "sessions" / f"{tag}-{n}"
    t0 = time.monotonic()
    with build_stack(cfg, run_dir.path, engine, records_dir=records, greedy=greedy, action_cache=action_cache) as stack:
        policy = LLMPolicy.from_engine(stack.engine, kw.lora, **policy_options(cfg))
        policy.load_state_dict(state["model"])
        stack.update_weights(policy.serving_state_dict(), int(state.get("policy_version", 0)))
        t_sessions = time.monotonic()
        res: dict[str, Any] = heldout_success(stack, eval_tasks, samples, tag)
        res["sessions_s"] = time.monotonic() - t_sessions
        if action_cache is not None:
            res["action_cache"] = stack.gateway.app.engine.stats()
            log.info("%s: action cache hit rate %.3f (%d hits, %d misses)", tag, res["action_cache"]["hit_rate"] or 0.0,
                     res["action_cache"]["hits"], res["action_cache"]["misses"])
    res["wall_s"] = time.monotonic() - t0
    res["greedy"] = greedy or (cfg.agent is not None and cfg.agent.temperature == 0)
    res.update(checkpoint=str(ckpt), step=int(state.get("iteration", state.get("step", 0))), samples_per_task=samples,
               policy_version=int(state.get("policy_version", 0)), records=str(records))
    return res


def policy_options(cfg: AgentRunConfig) -> dict[str, Any]:
    """``LLMPolicy`` options from a run config: the learner's device (``distribution.num_gpus``), and the
    ``policy.kwargs`` autocast and gradient checkpointing switches."""
    from polar.trainers.device import learner_device

    kw = cfg.policy.kwargs
    return {"device": learner_device(cfg.distribution.num_gpus), "autocast": kw.autocast,
            "gradient_checkpointing": kw.gradient_checkpointing}


def heldout_table(title: str, rows: dict[str, dict[str, Any]]) -> Any:
    """The held-out success table ``polar run`` and ``polar eval`` print, one row per evaluated stage."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("stage", "success", "reward mean", "sessions", "errors"):
        table.add_column(col)
    for stage, e in rows.items():
        reward = e.get("reward_mean")
        table.add_row(stage, f"{e['success']:.3f}", "-" if reward is None else f"{reward:.3f}", str(e["sessions"]),
                      str(e["errors"]))
    return table




# ---------------------------------------------------------------- the agent run: one loop, composed


class StackBuilder(Protocol):
    """``build_stack`` (in this process) or ``build_ray_stack`` (sessions on Ray gateway nodes)."""

    def __call__(self, cfg: AgentRunConfig, run_dir_path: Path, engine: Any = None, records_dir: Path | None = None,
                 training: bool = False) -> LocalStack | RaySessionStack: ...


@dataclass(frozen=True)
class StackCloser:
    """Stops a rollout stack when the loop closes it (after the final evaluation, before the logger: the
    stack's threads log until they stop)."""

    stack: LocalStack | RaySessionStack

    def close(self) -> None:
        self.stack.stop()


class RewardHistory(Protocol):
    """A GRPO learner's mean reward per step (``GRPOLearner.reward_means``): the summary's first and last."""

    reward_means: list[float]


class AgentEvaluator:
    """Held-out success over ``eval_tasks`` with the engine's current weights (``{}`` without eval_tasks):

    - ``before``: GRPO's starting point (``grpo``: the GRPO learner; None for SFT) (after the SFT warm-up), ``eval/before_grpo.json``; a resumed run reads
      that file instead of scoring the starting weights again;
    - ``periodic``: every ``eval_every`` GRPO steps (not the last), as ``eval_*`` fields of the step's row;
    - ``final``: ``eval_after`` (GRPO, ``eval/after_grpo.json``) or ``eval_final`` (SFT, ``eval/final.json``),
      and ``eval/summary.json``: the evaluations plus ``<name>: {steps, time_s, reward_first, reward_last}``
      (``grpo: {...}``)."""

    def __init__(self, run_dir: RunDir, stack: SessionStack, eval_tasks: list[dict[str, Any]], samples: int,
                 resumed: bool, grpo: RewardHistory | None = None, eval_every: int = 0, total_steps: int = 0,
                 name: str = "") -> None:
        self.run_dir = run_dir
        self.stack = stack
        self.eval_tasks = eval_tasks
        self.samples = samples
        self.resumed = resumed
        self.grpo = grpo
        self.eval_every = eval_every
        self.total_steps = total_steps
        self.name = name  # the RL stage's key in the summary (its registry row's name)
        self.summary: dict[str, Any] = {}
        self._t0 = time.monotonic()

    def evaluate(self, tag: str, write: bool = True) -> dict[str, Any]:
        if not self.eval_tasks:
            return {}
        res: dict[str, Any] = heldout_success(self.stack, self.eval_tasks, self.samples, tag)
        if write:
            self.run_dir.write_json(f"eval/{tag}.json", res)
            log.info("held-out success (%s): %.3f over %d sessions", tag, res["success"], res["sessions"])
        return res

    def before(self, progress: Progress) -> dict[str, Any]:
        self._t0 = time.monotonic()
        if self.grpo is None:
            return {}
        done = self.run_dir.path / "eval" / "before_grpo.json"
        before: dict[str, Any] | None = None
        if self.resumed and done.is_file():
            try:
                before = dict(json.loads(done.read_text()))
            except (OSError, ValueError) as e:
                log.warning("could not read %s (%s); evaluating the starting weights again", done, e)
        self.summary["eval_before"] = before if before is not None else self.evaluate("before_grpo")
        return dict(self.summary)

    def periodic(self, progress: Progress) -> Metrics:
        if self.eval_every and progress.iteration % self.eval_every == 0 and progress.iteration < self.total_steps:
            res = self.evaluate(f"iter_{progress.iteration:08d}", write=False)
            return {f"eval_{k}": v for k, v in res.items()}
        return {}

    def final(self, progress: Progress) -> dict[str, Any]:
        out: dict[str, Any]
        if self.grpo is not None:
            stage: dict[str, Any] = {"steps": progress.iteration, "time_s": round(time.monotonic() - self._t0, 1)}
            if self.grpo.reward_means:
                stage.update(reward_first=self.grpo.reward_means[0], reward_last=self.grpo.reward_means[-1])
            out = {"eval_after": self.evaluate("after_grpo"), self.name: stage}
        else:
            out = {"eval_final": self.evaluate("final")}
        self.run_dir.write_json("eval/summary.json", {**self.summary, **out})
        return out


@dataclass(frozen=True)
class AgentContext:
    """What every agent row composes from: the config, the run directory, the started rollout stack, the policy
    the learner trains (built from the stack's engine), the checkpoint to resume from (None: a fresh run), and
    the held-out tasks."""

    cfg: AgentRunConfig
    run_dir: RunDir
    stack: LocalStack | RaySessionStack
    policy: LLMPolicy
    state: Mapping[str, Any] | None
    eval_tasks: list[dict[str, Any]]


@dataclass(frozen=True)
class AgentParts:
    """An agent row's share of the loop: collector, learner, evaluator, budget, warm-up stages, the episodes
    ``episode_reward_mean`` averages over."""

    collector: Collector[Any]
    learner: Learner[Any]
    evaluator: Evaluator
    budget: Budget
    warm_up: Sequence[Stage[Any]] = ()
    episode_window: int = 100


@dataclass(frozen=True)
class AgentAlgorithm:
    """One agent algorithm's row (``polar.trainers.registry.AGENT_ALGORITHMS``): its ``policy.kwargs`` model,
    ``check(cfg)`` (config errors found before the stack starts) and ``make_parts(context)``."""

    kwargs: type[BaseModel]
    make_parts: Callable[[AgentContext], AgentParts]
    check: Callable[[AgentRunConfig], None] = lambda cfg: None


def build_agent_loop(row: AgentAlgorithm, cfg: AgentRunConfig, run_dir: RunDir, resume: bool = False,
                     on_iteration: OnIteration | None = None, extra_metrics: Metrics | None = None,
                     engine: Any = None, stack_builder: StackBuilder = build_stack) -> TrainingLoop[Any]:
    """The loop of an agent run, composed (module docstring) from its algorithm's ``row``
    (``polar.trainers.registry.agent_algorithm``); its rollout stack is started here and stopped when the loop
    ends. ``engine``: an inference engine already loaded (tests, benchmarks) instead of the one the config
    names; ``resume``: continue from the run directory's newest checkpoint."""
    from polar.models.llm_policy import LLMPolicy
    from polar.trainers.checkpoint import CheckpointManager
    from polar.trainers.loop import TrainingLoop
    from polar.trainers.observe import RunLogs

    row.check(cfg)  # before minutes of engine start
    state: Mapping[str, Any] | None = None
    if resume:
        ckpt, state = CheckpointManager(run_dir.checkpoints_dir, keep=cfg.logging.keep_checkpoints).load_newest()
        if ckpt is not None:
            log.info("resuming from checkpoint %s", ckpt)
    run_dir.update_meta(kind=f"agentic-{cfg.policy.type}")
    eval_tasks = load_tasks(cfg.eval_tasks, cfg.config_dir) if cfg.eval_tasks else []
    logs = RunLogs(cfg.logging, run_dir)  # before the stack: engine and gateway start-up lines go to RUN/logs/
    try:
        stack = stack_builder(cfg, run_dir.path, engine, training=True).__enter__()
    except BaseException:
        logs.close()
        raise
    try:
        policy = LLMPolicy.from_engine(stack.engine, cfg.policy.kwargs.lora, **policy_options(cfg))
        parts = row.make_parts(AgentContext(cfg, run_dir, stack, policy, state, eval_tasks))
        return TrainingLoop(cfg, run_dir, parts.collector, parts.learner, parts.evaluator, budget=parts.budget,
                            state=state, episode_window=parts.episode_window, on_iteration=on_iteration,
                            extra_metrics=extra_metrics, warm_up=parts.warm_up, close_after=[StackCloser(stack)],
                            run_logs=logs)
    except BaseException:
        stack.stop()
        logs.close()
        raise
