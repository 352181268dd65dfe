"""The ``polar eval --suite FILE`` schema: policies, harnesses (with wrappers, held-out seeds, metrics), how
to run them in parallel, and which confidence interval the report gives. See docs/evaluation.md."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, PrivateAttr, Tag, field_validator, model_validator

from polar.config.base import StrictModel, did_you_mean, validate
from polar.config.harness import HarnessConfig
from polar.config.loader import read_yaml_file
from polar.errors import ConfigError


# ---------------------------------------------------------------- robustness wrappers
class ObservationNoiseSpec(StrictModel):
    """Gaussian noise (``std``, in observation units) added to Box observations (``keys``: of a Dict space)."""

    type: Literal["observation_noise"]
    std: float = Field(gt=0)
    keys: list[str] | None = None


class ActionDelaySpec(StrictModel):
    """The env executes the action chosen ``steps`` steps earlier (a no-op action before that)."""

    type: Literal["action_delay"]
    steps: int = Field(ge=1)


class ActionRepeatSpec(StrictModel):
    """Each chosen action is executed ``times`` times (rewards summed), as frame skipping does."""

    type: Literal["action_repeat"]
    times: int = Field(ge=2)


class StickyActionsSpec(StrictModel):
    """With probability ``prob`` the env repeats the previous action instead of the chosen one (Machado et al.)."""

    type: Literal["sticky_actions"]
    prob: float = Field(gt=0, lt=1)


class DistractorFeaturesSpec(StrictModel):
    """``count`` extra N(0, std) features appended to a flat Box observation (the policy must take them)."""

    type: Literal["distractor_features"]
    count: int = Field(ge=1)
    std: float = Field(1.0, gt=0)


WrapperSpec = Annotated[
    ObservationNoiseSpec | ActionDelaySpec | ActionRepeatSpec | StickyActionsSpec | DistractorFeaturesSpec,
    Field(discriminator="type"),
]


# ---------------------------------------------------------------- metrics, seeds, intervals
class MetricSpec(StrictModel):
    """A metric by name (``polar.evaluation.metrics``) with its options."""

    name: str
    info_key: str | None = Field(None, description="constraint_violations: the info key that marks a violation")
    usd_per_1m_prompt_tokens: float = Field(0.0, ge=0, description="cost_per_session_usd: price of prompt tokens")
    usd_per_1m_completion_tokens: float = Field(0.0, ge=0, description="cost_per_session_usd: price of sampled tokens")
    success_threshold: float = Field(1.0, description="agent success_rate: a session succeeds at reward >= this, "
                                                      "unless its verifier gives a success verdict (LLM env agents)")


def _metric_item(v: Any) -> Any:
    return {"name": v} if isinstance(v, str) else v


class SeedRange(StrictModel):
    """Episode ``k`` of an env harness is reset with seed ``start + k``; keep it apart from training seeds."""

    start: int = Field(1_000_000, ge=0)
    count: int = Field(20, ge=1)

    def seeds(self) -> list[int]:
        return list(range(self.start, self.start + self.count))


class IntervalSpec(StrictModel):
    """``bootstrap``: percentile bootstrap of the mean; ``t``: Student-t interval of the mean."""

    method: Literal["bootstrap", "t"] = "bootstrap"
    level: float = Field(0.95, gt=0, lt=1)
    resamples: int = Field(2000, ge=100)
    seed: int = 0


class ParallelSpec(StrictModel):
    """Where the (harness, policy) jobs run: ``local`` processes (``workers`` at once) or Ray tasks."""

    backend: Literal["local", "ray"] = "local"
    workers: int = Field(2, ge=1, description="local: processes at once; ray: tasks in flight")
    address: str | None = Field(None, description="ray: cluster address (default: auto, else a local cluster)")
    job_timeout_s: float = Field(1800.0, gt=0, description="a job running longer than this fails with a timeout")


# ---------------------------------------------------------------- policies
class PolicySpec(StrictModel):
    """One policy to evaluate: exactly one of ``checkpoint``, ``run`` (its latest checkpoint), ``ensemble``
    (names of other policies: the mean of their action distributions) or ``model`` (agent harnesses: a
    model as it is, e.g. ``tiny``, ``smollm2-135m`` or a local folder)."""

    name: str = Field(min_length=1)
    checkpoint: str | None = None
    run: str | None = None
    ensemble: list[str] | None = None
    model: str | dict[str, Any] | None = Field(
        None, description="agent harnesses: a model name (tiny, smollm2-135m, a folder) or a model section, e.g. "
        "{engine: openai_compat, base_url: URL, model: NAME, api_key_env: VAR}")

    @model_validator(mode="after")
    def _one_source(self) -> PolicySpec:
        given = [k for k in ("checkpoint", "run", "ensemble", "model") if getattr(self, k) is not None]
        if len(given) != 1:
            what = f"got {', '.join(given)}" if given else "got none"
            raise ValueError(f"policy {self.name!r} needs exactly one of checkpoint, run, ensemble, model ({what})")
        if self.ensemble is not None and len(self.ensemble) < 2:
            raise ValueError(f"policy {self.name!r}: an ensemble needs at least 2 members (got {self.ensemble})")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("checkpoint", "run", "ensemble", "model") if getattr(self, k) is not None)


# ---------------------------------------------------------------- harnesses
ENV_DEFAULT_METRICS = ["return", "success_rate", "episode_length", "time_to_completion_s"]
AGENT_DEFAULT_METRICS = ["return", "success_rate", "tokens_per_session", "calls_per_session",
                         "cost_per_session_usd", "time_to_completion_s"]


class _HarnessBase(StrictModel):
    name: str = Field(min_length=1)
    policies: list[str] | None = Field(None, description="names of the policies to evaluate here (default: all)")
    config: str | None = Field(None, description="a polar run config whose harness (and agent sections) to use")
    metrics: list[MetricSpec] = Field(default_factory=list)

    _metric_item = field_validator("metrics", mode="before")(
        classmethod(lambda cls, v: [_metric_item(x) for x in v] if isinstance(v, list) else v))


class EnvHarnessSpec(_HarnessBase):
    """A Gymnasium env or a connector game. ``harness`` (inline) or ``config`` name it; without either,
    each policy's own run harness is used."""

    kind: Literal["env"] = "env"
    harness: HarnessConfig | None = None
    wrappers: list[WrapperSpec] = Field(default_factory=list)
    seeds: SeedRange = Field(default_factory=SeedRange)
    deterministic: bool = True
    num_envs: int = Field(4, ge=1, description="env copies stepped together (one forward pass for all)")
    max_episode_steps: int = Field(100_000, ge=1, description="an episode this long is cut (truncated)")

    @model_validator(mode="after")
    def _defaults(self) -> EnvHarnessSpec:
        if self.harness is not None and self.harness.type == "agent":
            raise ValueError(f"harness {self.name!r}: an agent harness is 'kind: agent' with 'config:' (a run "
                             "config with harness.type: agent), not an inline env harness")
        if not self.metrics:
            self.metrics = [MetricSpec(name=n) for n in ENV_DEFAULT_METRICS]
        return self


class AgentHarnessSpec(_HarnessBase):
    """An agent harness (``harness.type: agent`` in ``config`` or in the policy's run) over a held-out task file."""

    kind: Literal["agent"]
    tasks: str | None = Field(None, description="held-out tasks JSONL (default: the config's eval_tasks)")
    samples_per_task: int = Field(1, ge=1)
    max_tasks: int | None = Field(None, ge=1, description="only the first N tasks (small budgets)")
    deterministic: bool = Field(True, description="greedy decoding (reproducible); false: sample at the "
                                                  "harness's temperature")
    seed: int = Field(0, description="sampling seed when deterministic is false")

    @model_validator(mode="after")
    def _defaults(self) -> AgentHarnessSpec:
        if not self.metrics:
            self.metrics = [MetricSpec(name=n) for n in AGENT_DEFAULT_METRICS]
        return self


def _harness_kind(v: Any) -> str:
    if isinstance(v, dict):
        return v.get("kind", "env")
    return getattr(v, "kind", "env")


HarnessSpec = Annotated[
    Annotated[EnvHarnessSpec, Tag("env")] | Annotated[AgentHarnessSpec, Tag("agent")],
    Discriminator(_harness_kind),
]


class EvalSuite(StrictModel):
    name: str = "suite"
    out_dir: str | None = Field(None, description="where the report goes (default: eval-reports/<name>-<time>)")
    policies: list[PolicySpec] = Field(min_length=1)
    harnesses: list[HarnessSpec] = Field(min_length=1)
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    interval: IntervalSpec = Field(default_factory=IntervalSpec)

    _base_dir: Path | None = PrivateAttr(default=None)

    @property
    def base_dir(self) -> Path:
        """The suite file's directory: relative paths in the suite resolve here."""
        return self._base_dir or Path.cwd()

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.base_dir / p

    def policy(self, name: str) -> PolicySpec:
        return next(p for p in self.policies if p.name == name)

    def policies_for(self, harness: EnvHarnessSpec | AgentHarnessSpec) -> list[PolicySpec]:
        return [self.policy(n) for n in harness.policies] if harness.policies else list(self.policies)

    @model_validator(mode="after")
    def _cross_check(self) -> EvalSuite:
        from polar.evaluation.metrics import get_metric, metric_names

        names = [p.name for p in self.policies]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"policies: names must be unique; {', '.join(dup)} appear more than once")
        hnames = [h.name for h in self.harnesses]
        hdup = sorted({n for n in hnames if hnames.count(n) > 1})
        if hdup:
            raise ValueError(f"harnesses: names must be unique; {', '.join(hdup)} appear more than once")
        for p in self.policies:
            for m in p.ensemble or []:
                if m not in names:
                    raise ValueError(f"policy {p.name!r}: ensemble member {m!r} is not a policy{did_you_mean(m, names)}")
                if self.policy(m).ensemble is not None or self.policy(m).model is not None:
                    raise ValueError(f"policy {p.name!r}: ensemble member {m!r} must be a checkpoint or a run")
        for h in self.harnesses:
            for n in h.policies or []:
                if n not in names:
                    raise ValueError(f"harness {h.name!r}: policy {n!r} is not defined{did_you_mean(n, names)}")
            for spec in h.metrics:
                if spec.name not in metric_names():
                    raise ValueError(f"harness {h.name!r}: unknown metric {spec.name!r}{did_you_mean(spec.name, metric_names())}"
                                     f"; known: {', '.join(metric_names())}")
                metric = get_metric(spec.name)
                if h.kind not in metric.kinds:
                    raise ValueError(f"harness {h.name!r}: metric {spec.name!r} applies to {'/'.join(metric.kinds)} "
                                     f"harnesses, not {h.kind}")
                if spec.name == "constraint_violations" and not spec.info_key:
                    raise ValueError(f"harness {h.name!r}: constraint_violations needs info_key (the info key that "
                                     "marks a violation, e.g. {name: constraint_violations, info_key: cost})")
            if h.kind == "env":
                for p in self.policies_for(h):
                    if p.model is not None:
                        raise ValueError(f"harness {h.name!r}: policy {p.name!r} is a model; models run on agent "
                                         "harnesses only")
            else:
                if h.config is None and any(p.model is not None for p in self.policies_for(h)):
                    raise ValueError(f"harness {h.name!r}: policy {next(p.name for p in self.policies_for(h) if p.model)!r} "
                                     "is a model with no run config, so the agent harness needs 'config:' (a run "
                                     "config with harness.type: agent, e.g. examples/agentic/calculator_grpo.yaml)")
        return self


def load_suite(path: str | Path) -> EvalSuite:
    """Read and validate a suite file; relative paths in it resolve next to it."""
    p = Path(path)
    if not p.is_file():
        what = "a directory" if p.is_dir() else "not found"
        raise ConfigError(f"suite file {p} is {what}; pass a suite YAML to --suite (docs/evaluation.md shows one)")
    suite = validate(EvalSuite, read_yaml_file(p), source=str(p))
    suite._base_dir = p.resolve().parent
    return suite
