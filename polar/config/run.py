"""The top-level run config: one YAML file per run (``polar run --config FILE``).

``RunConfig`` is a union of two kinds of run, each with only its own sections:

- ``EnvRunConfig`` (``kind == "env"``): an env harness (``harness.type: gymnasium | envpool | custom``) driven by a
  network (``agent.type: mlp | cnn | lstm | custom``) and trained with PPO, APPO, DQN or SAC on env fragments
  (GAIL and AIRL: PPO on a discriminator's reward; distill: KL to a teacher; hierarchical: a manager over skills),
  or with BC, IQL or CQL from a dataset.
- ``AgentRunConfig`` (``kind == "agent"``): an LLM behind the gateway, trained with GRPO or SFT on sessions.
  Either a black-box agent harness (``harness.type: agent``), or an env harness whose policy is the built-in
  LLM agent (``agent: {type: llm}``).

Which kind a mapping is, is decided in one place, ``run_kind_of`` (the union's callable discriminator): it
depends on ``harness.type`` and ``agent.type``. A new kind of run is a new member class plus a branch there.
A section of the other kind (``gateway:`` in an env run, ``eval:`` in an agent run) is an error that names the
key and the kind of run it belongs to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import Discriminator, Field, PrivateAttr, Tag, model_validator
from pydantic_core import PydanticCustomError

from polar.config.agent import BuiltinAgentConfig, CustomAgentConfig
from polar.config.agentic import ModelConfig, SessionsConfig, TrajectoryConfig, VerifierConfig
from polar.config.base import StrictModel, did_you_mean
from polar.config.continual import InitConfig, ReplayMixConfig, old_task_names
from polar.config.curriculum import CurriculumConfig, stage_harness
from polar.config.distill import DistillPolicyConfig
from polar.config.gail import AIRLPolicyConfig, GAILPolicyConfig
from polar.config.gateway import GatewayConfig
from polar.config.grpo import ROLLOUT_MAX_TOKENS, ROLLOUT_TEMPERATURE, SFTWarmupConfig
from polar.config.harness import (
    AgentHarnessConfig,
    CustomHarnessConfig,
    EnvPoolHarnessConfig,
    GymnasiumHarnessConfig,
)
from polar.config.hierarchical import HierarchicalPolicyConfig
from polar.config.llm_agent import LLMAgentConfig, TaskSource, overlapping_seeds
from polar.config.mbpo import MBPOPolicyConfig
from polar.config.multi_agent import PettingZooHarnessConfig
from polar.config.partial import check_partial_rollouts
from polar.config.policy import (
    OFF_POLICY,
    ON_POLICY,
    APPOPolicyConfig,
    BCPolicyConfig,
    CQLPolicyConfig,
    DQNPolicyConfig,
    GRPOPolicyConfig,
    IQLPolicyConfig,
    PPOPolicyConfig,
    SACPolicyConfig,
    SFTPolicyConfig,
)
from polar.config.sections import DistributionConfig, EvalConfig, LoggingConfig

RunKind = Literal["env", "agent"]


def _types(*models: type[StrictModel]) -> tuple[str, ...]:
    return tuple(t for m in models for t in get_args(m.model_fields["type"].annotation))



_AGENT_RUN = "agent runs (harness.type: agent, or agent: {type: llm} on an env harness)"
_ENV_RUN = "env runs (harness.type: gymnasium or custom, with a network agent)"


class _RunBase(StrictModel):
    """Sections every run has."""

    kind: ClassVar[RunKind]

    name: str = "run"
    distribution: DistributionConfig = Field(default_factory=DistributionConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    seed: int = 0

    _config_dir: Path | None = PrivateAttr(default=None)

    @property
    def config_dir(self) -> Path:
        """Directory of the YAML file; user modules resolve here first, then the working directory."""
        return self._config_dir or Path.cwd()


EnvPolicyConfig = Annotated[
    PPOPolicyConfig | APPOPolicyConfig | DQNPolicyConfig | SACPolicyConfig | BCPolicyConfig | IQLPolicyConfig
    | CQLPolicyConfig | GAILPolicyConfig | AIRLPolicyConfig | HierarchicalPolicyConfig | DistillPolicyConfig
    | MBPOPolicyConfig,
    Field(discriminator="type")]
AgentPolicyConfig = Annotated[GRPOPolicyConfig | SFTPolicyConfig, Field(discriminator="type")]
EnvHarnessConfig = Annotated[GymnasiumHarnessConfig | EnvPoolHarnessConfig | CustomHarnessConfig | PettingZooHarnessConfig,
                             Field(discriminator="type")]
NetworkAgentConfig = Annotated[BuiltinAgentConfig | CustomAgentConfig, Field(discriminator="type")]
AnyHarnessConfig = Annotated[
    GymnasiumHarnessConfig | EnvPoolHarnessConfig | CustomHarnessConfig | PettingZooHarnessConfig | AgentHarnessConfig,
    Field(discriminator="type")]




def _members(union: Any) -> tuple[type[StrictModel], ...]:
    """The models of an ``Annotated[A | B, Field(discriminator=...)]`` union."""
    return get_args(get_args(union)[0])


# the type names each kind accepts, read off the unions above (adding a member there is all it takes)
HARNESS_TYPES = _types(*_members(AnyHarnessConfig))
AGENT_TYPES = _types(*_members(NetworkAgentConfig), LLMAgentConfig)
ENV_POLICIES = _types(*_members(EnvPolicyConfig))
AGENT_POLICIES = _types(*_members(AgentPolicyConfig))


def check_continual(cfg: EnvRunConfig, online: tuple[str, ...], off_policy: tuple[str, ...]) -> None:
    """Cross-section rules of ``init``, ``replay_mix`` and ``eval.old_tasks`` on an env run; ValueError naming the key and the fix."""
    algo = cfg.policy.type
    if cfg.init is not None and algo not in online:
        raise ValueError(f"init: starts an online run ({', '.join(online)}) from earlier weights; policy.type {algo!r} "
                         "is none of those. Remove init")
    if cfg.replay_mix is not None:
        if algo not in online:
            raise ValueError(f"replay_mix: mixes an old dataset into the batches of {' or '.join(off_policy)}; policy.type "
                             f"{algo!r} is neither. Remove replay_mix")
        if algo not in off_policy:
            raise ValueError(
                f"replay_mix: policy.type {algo!r} learns on-policy, from rollouts of its current weights only; old "
                f"transitions would be off-policy data in its update. Use {' or '.join(off_policy)} for a replay mix, "
                "or remove replay_mix (init alone starts PPO/APPO from the old weights)")
        if getattr(cfg.policy.kwargs, "prioritized_replay", False):
            raise ValueError("replay_mix: prioritized replay is not mixed (the old dataset has no priorities); set "
                             "policy.kwargs.prioritized_replay: false or remove replay_mix")
    tasks = cfg.eval.old_tasks
    if tasks:
        if algo not in online:
            raise ValueError(f"eval.old_tasks: measures forgetting in online runs ({', '.join(online)}); policy.type "
                             f"{algo!r} trains from a dataset. Remove eval.old_tasks")
        for i, task in enumerate(tasks):
            if task.harness is None and cfg.harness.type != "gymnasium":
                raise ValueError(f"eval.old_tasks[{i}]: id/kwargs vary a gymnasium harness, and this run's is "
                                 f"harness.type {cfg.harness.type}; give the old task a whole harness section")
        names = old_task_names(cfg.harness, tasks)
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"eval.old_tasks: the name {dup[0]!r} is used twice; give each old task its own name")


class EnvRunConfig(_RunBase):
    """An env harness, a network agent, PPO/APPO/DQN/SAC on env fragments."""

    kind: ClassVar[RunKind] = "env"

    harness: EnvHarnessConfig
    agent: NetworkAgentConfig = Field(default_factory=BuiltinAgentConfig)
    policy: EnvPolicyConfig
    eval: EvalConfig = Field(default_factory=EvalConfig)
    total_env_steps: int = Field(100_000, ge=1)
    stop_reward: float | None = Field(None, description="stop early once the 100-episode training mean return reaches this")
    nonfinite: Literal["fail", "skip"] = Field(
        "fail", description="NaN/inf in observations or rewards: fail naming the source, or skip the fragment and "
        "count it (nonfinite_skipped_fragments); a non-finite loss always fails")
    init: InitConfig | None = Field(None, description="start from an earlier run's weights (docs/offline.md, Continual)")
    replay_mix: ReplayMixConfig | None = Field(None, description="DQN/SAC: a share of every batch from an old dataset")
    curriculum: CurriculumConfig | None = Field(None, description="env variants trained in order, advanced on the "
                                                "training success rate (docs/exploration.md)")

    @model_validator(mode="before")
    @classmethod
    def _only_env_sections(cls, data: Any) -> Any:
        _refuse_other_kind(data, "env")
        _refuse_off_policy_intrinsic(data)
        return data

    @model_validator(mode="after")
    def _continual(self) -> EnvRunConfig:
        check_continual(self, ON_POLICY + OFF_POLICY, OFF_POLICY)
        return self

    @model_validator(mode="after")
    def _curriculum(self) -> EnvRunConfig:
        if self.curriculum is None:
            return self
        problem = None
        if self.policy.type not in ON_POLICY + OFF_POLICY:
            problem = f"curriculum: policy {self.policy.type!r} trains from a dataset, not an env; remove the section"
        elif self.distribution.backend != "local":
            problem = ("curriculum needs distribution.backend: local (the Ray backend does not rebuild its actors' "
                       "envs between stages yet)")
        for i, stage in enumerate(self.curriculum.stages):
            try:
                stage_harness(self.harness, stage, i)
            except ValueError as e:
                problem = problem or str(e)
        if problem is not None:  # one line naming the key, without the whole config echoed
            raise PydanticCustomError("run_section", "{problem}", {"problem": problem})
        return self

    @model_validator(mode="after")
    def _learner_group(self) -> EnvRunConfig:
        _refuse_learner_group(self.distribution, self.policy.type, ("ppo", "appo"))
        d, n = self.distribution, self.distribution.num_learners
        if n > 1 and getattr(self.policy.kwargs, "intrinsic", None) is not None:
            raise PydanticCustomError("run_section", "{problem}", {"problem": (
                "policy.kwargs.intrinsic needs distribution.num_learners: 1 (the reward module is not shared across "
                "learner ranks yet); drop one of them")})
        if n > 1:  # each rank trains on its own env columns of a batch: PPO's all workers' fragments, APPO's one
            workers = 1 if self.policy.type == "appo" else (
                d.autoscale.min_rollout_workers if d.autoscale is not None else max(1, d.rollout_workers))
            columns = d.envs_per_runner * workers
            if columns < n:
                raise PydanticCustomError("run_section", "{problem}", {"problem": (
                    f"distribution.num_learners: {n} learners each train on their own env columns of a batch, but "
                    f"each {self.policy.type.upper()} batch has {columns} (envs_per_worker {d.envs_per_runner}"
                    f"{'' if workers == 1 else f' x {workers} rollout workers'}); raise distribution.envs_per_worker "
                    "or lower num_learners")})
        return self


def _refuse_learner_group(d: DistributionConfig, policy_type: str, honoured: tuple[str, ...]) -> None:
    """``num_learners > 1`` for a row without a learner group: one line naming the key (no config echoed)."""
    if d.num_learners > 1 and policy_type not in honoured:
        raise PydanticCustomError("run_section", "{problem}", {"problem": (
            f"distribution.num_learners: {d.num_learners} is honoured by PPO and APPO (env runs), GRPO and SFT "
            f"(agent runs); policy {policy_type} trains on one learner: set num_learners: 1")})


class AgentRunConfig(_RunBase):
    """An LLM policy behind the gateway, GRPO/SFT on sessions: a black-box agent harness, or the built-in LLM
    agent (``agent: {type: llm}``) playing an env harness (each episode one session, its return the reward)."""

    kind: ClassVar[RunKind] = "agent"

    harness: AnyHarnessConfig
    agent: LLMAgentConfig | None = Field(
        None, description="env harnesses only: the built-in LLM agent (an agent harness brings its own agent)")
    policy: AgentPolicyConfig
    tasks: str | TaskSource | None = Field(None, description="a tasks JSONL, or a generated source (seeds, reasoning_gym, ...)")
    verifier: VerifierConfig | None = None
    model: ModelConfig | None = None
    trajectory: TrajectoryConfig = Field(default_factory=TrajectoryConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    eval_tasks: str | TaskSource | None = Field(
        None, description="held-out tasks (JSONL or a generated source) scored at start/end of training")
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    sft_warmup: SFTWarmupConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _only_agent_sections(cls, data: Any) -> Any:
        _refuse_other_kind(data, "agent")
        return data

    @model_validator(mode="after")
    def _disjoint_tasks(self) -> AgentRunConfig:
        why = overlapping_seeds(self.tasks, self.eval_tasks)
        if why:
            raise ValueError(why)
        if getattr(self.eval_tasks, "advance", None) is not None:
            raise ValueError("eval_tasks.advance: held-out tasks keep their levels, so scores stay comparable; "
                             "set advance on tasks (the training tasks) only")
        return self

    @model_validator(mode="after")
    def _learner_group(self) -> AgentRunConfig:
        _refuse_learner_group(self.distribution, self.policy.type, ("grpo", "sft"))
        return self

    @model_validator(mode="after")
    def _rollout_sampling(self) -> AgentRunConfig:
        """``policy.kwargs.temperature`` and ``max_tokens`` resolved (written so into config.resolved.yaml, so a
        resumed run samples as the first did): the built-in LLM agent's own settings, else polar's defaults."""
        kwargs = getattr(self.policy, "kwargs", None)
        if kwargs is None or not hasattr(kwargs, "temperature"):
            return self  # SFT samples nothing
        if kwargs.temperature is None:
            object.__setattr__(kwargs, "temperature", self.agent.temperature if self.agent else ROLLOUT_TEMPERATURE)
        if kwargs.max_tokens is None:
            object.__setattr__(kwargs, "max_tokens", self.agent.max_tokens if self.agent else ROLLOUT_MAX_TOKENS)
        return self

    @model_validator(mode="after")
    def _no_action_cache(self) -> AgentRunConfig:
        if self.gateway.action_cache is not None:
            raise ValueError("gateway.action_cache is for serving (polar gateway --config) and evaluation (polar eval RUN "
                             "--action-cache N --greedy); a training run samples fresh answers and changes its weights "
                             "every step, so remove gateway.action_cache from the run's config")
        return self

    @model_validator(mode="after")
    def _partial_rollouts(self) -> AgentRunConfig:
        if getattr(self.policy.kwargs, "partial_rollouts", None) is not None:
            check_partial_rollouts(self.model, self.gateway)
        return self

    @model_validator(mode="after")
    def _step_advantage_needs_turns(self) -> AgentRunConfig:
        kwargs = getattr(self.policy, "kwargs", None)
        if getattr(kwargs, "step_advantage", None) is not None and self.agent is None:
            raise ValueError("policy.kwargs.step_advantage compares the turns of env episodes, which only the built-in "
                             "LLM agent reports (agent: {type: llm} on an env harness); an agent harness's sessions "
                             "have no turns, so drop step_advantage")
        return self


def _type_of(data: Any, key: str) -> Any:
    section = data.get(key) if isinstance(data, dict) else getattr(data, key, None)
    return section.get("type") if isinstance(section, dict) else getattr(section, "type", None)


def run_kind_of(data: Any) -> RunKind | None:
    """The kind of run a config mapping (or a validated config) describes: ``agent`` for an agent harness
    (``harness.type: agent``) or for the LLM agent on an env harness (``agent.type: llm``), else ``env``.

    The one place that tells the two apart. None (not a mapping) lets pydantic say what is wrong."""
    if isinstance(data, (EnvRunConfig, AgentRunConfig)):
        return data.kind
    if not isinstance(data, dict):
        return None
    if _type_of(data, "harness") == "agent" or _type_of(data, "agent") == "llm":
        return "agent"
    return "env"


def _refuse_off_policy_intrinsic(data: Any) -> None:
    """``policy.kwargs.intrinsic`` on an algorithm that has no reward module: one line saying why (the kwargs
    model would only call it an unknown key)."""
    policy = data.get("policy") if isinstance(data, dict) else None
    kwargs = policy.get("kwargs") if isinstance(policy, dict) else None
    algo = policy.get("type") if isinstance(policy, dict) else None
    if isinstance(kwargs, dict) and "intrinsic" in kwargs and algo not in ON_POLICY:
        raise PydanticCustomError(
            "run_section", "'policy.kwargs.intrinsic': an intrinsic reward (RND) trains with on-policy PPO or APPO; policy "
            "'{algo}' does not take one; remove policy.kwargs.intrinsic or use policy.type: ppo", {"algo": algo})


def _refuse_other_kind(data: Any, kind: RunKind) -> None:
    """A section (or a policy / agent type) of the other kind of run: one line naming the key and its kind."""
    if not isinstance(data, dict):
        return
    for section, known in (("harness", HARNESS_TYPES), ("agent", AGENT_TYPES)):
        given = _type_of(data, section)
        if isinstance(given, str) and given not in known:  # the union would list one kind's types only
            raise PydanticCustomError(
                "run_section", "'{section}.type': unknown type '{given}'{hint}; use one of {known}",
                {"section": section, "given": given, "hint": did_you_mean(given, list(known)),
                 "known": ", ".join(known)})
    own = EnvRunConfig if kind == "env" else AgentRunConfig
    other = AgentRunConfig if kind == "env" else EnvRunConfig
    harness = _type_of(data, "harness")
    this_run = (f"this is an env run (harness.type: {harness})" if kind == "env"
                else "this is an agent run (harness.type: agent)" if harness == "agent"
                else f"this is an agent run (agent.type: llm on harness.type: {harness})")
    for key in data:
        if key not in own.model_fields and key in other.model_fields:
            belongs = _AGENT_RUN if kind == "env" else _ENV_RUN
            raise PydanticCustomError(
                "run_section", "'{key}' is a section of {belongs}, and {this_run}; remove it",
                {"key": key, "belongs": belongs, "this_run": this_run})
    policy = _type_of(data, "policy")
    allowed, others, belongs = ((ENV_POLICIES, AGENT_POLICIES, _AGENT_RUN) if kind == "env"
                                else (AGENT_POLICIES, ENV_POLICIES, _ENV_RUN))
    if policy in others:
        raise PydanticCustomError(
            "run_section", "policy.type '{policy}' trains {belongs}, and {this_run}: use {allowed}",
            {"policy": policy, "belongs": belongs, "this_run": this_run, "allowed": " or ".join(allowed)})
    if kind == "agent" and harness == "agent" and isinstance(data.get("agent"), dict):
        raise PydanticCustomError(
            "run_section", "'agent': an agent harness (harness.type: agent) brings its own agent; remove the "
            "agent section (agent: {type: llm} is the LLM agent for env harnesses)", {})


RunConfig = Annotated[
    Annotated[EnvRunConfig, Tag("env")] | Annotated[AgentRunConfig, Tag("agent")],
    Discriminator(run_kind_of),
]
"""Any run's config; ``cfg.kind`` says which (``isinstance(cfg, EnvRunConfig)`` narrows it)."""


def validate_run_config(data: Any, source: str = "config") -> EnvRunConfig | AgentRunConfig:
    """A run config from a mapping (a parsed YAML file, a dump); ConfigError with one line per problem."""
    from polar.config.base import validate

    cfg: EnvRunConfig | AgentRunConfig = validate(RunConfig, data, source=source)
    return cfg
