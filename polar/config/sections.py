"""Small config sections shared by every kind of run: distribution, logging, eval."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from polar.config.base import StrictModel
from polar.config.continual import OldTaskConfig


class RoleResources(StrictModel):
    """What one actor of a role asks Ray for (ray backend)."""

    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources, e.g. {learner_box: 1} to pin a role to nodes started with "
                    "`ray start --resources '{\"learner_box\": 1}'`",
    )


class AutoscaleConfig(StrictModel):
    """The rule that resizes the rollout workers while a Ray run goes (see docs/distributed.md, "Autoscaling").

    Every ``interval_s`` (once all workers have started) it looks at what the learner measured:

    - **up** by ``step`` when the learner waited on an empty fragment queue for more than
      ``scale_up_wait_fraction`` of the interval (rollouts are the bottleneck) and the cluster has
      room for another rollout actor;
    - **down** by ``step`` when fragments queue up instead: on average at least
      ``scale_down_queue_per_worker`` finished fragments per worker were waiting for the learner (or
      the mean policy lag exceeded ``scale_down_policy_lag``, when set), and the learner waited less than
      ``scale_up_wait_fraction / 2`` of the interval;
    - otherwise hold. Never outside ``[min_rollout_workers, max_rollout_workers]``.

    A ``polar scale`` request wins: it sets the count (even outside the range) and turns the rule off
    for the rest of that run.
    """

    min_rollout_workers: int = Field(1, ge=1)
    max_rollout_workers: int = Field(..., ge=1)
    interval_s: float = Field(10.0, gt=0, description="seconds of measurement behind each decision")
    step: int = Field(1, ge=1, description="workers added or removed per decision")
    scale_up_wait_fraction: float = Field(
        0.2, gt=0, lt=1, description="scale up when the learner waited on fragments more than this fraction of the interval"
    )
    scale_down_queue_per_worker: float = Field(
        1.0, gt=0, description="scale down when this many finished fragments per worker waited for the learner, on average"
    )
    scale_down_policy_lag: float | None = Field(
        None, gt=0, description="also scale down when the mean policy lag (versions) exceeds this; null = off"
    )

    @model_validator(mode="after")
    def _range(self) -> AutoscaleConfig:
        if self.min_rollout_workers > self.max_rollout_workers:
            raise ValueError(
                f"min_rollout_workers ({self.min_rollout_workers}) is above max_rollout_workers "
                f"({self.max_rollout_workers}); set min <= max"
            )
        return self


class DistributionConfig(StrictModel):
    """Where rollouts and learning run. ``local``: processes on this machine; ``ray``: actors on a cluster."""

    backend: Literal["local", "ray"] = "local"
    rollout_workers: int = Field(0, ge=0, description="worker processes/actors; 0 = step envs in the learner")
    envs_per_worker: int | None = Field(
        None, ge=1, description="env copies per worker (one batched forward); default 1 per worker, or 8 when rollout_workers is 0"
    )
    num_gpus: float = Field(0, ge=0, description="GPUs for the learner; falls back to CPU with a warning when none")
    coordinator_address: str | None = Field(None, description="Ray: 'auto', 'ray://host:port', or None for a local cluster")
    rollout_resources: RoleResources = Field(default_factory=RoleResources)
    learner_resources: RoleResources = Field(default_factory=lambda: RoleResources(num_cpus=1.0))
    gateway_resources: RoleResources = Field(default_factory=RoleResources)
    connect_timeout_s: float = Field(30.0, gt=0)
    worker_timeout_s: float = Field(300.0, gt=0, description="local backend: a worker silent this long is reported as hung")
    max_learner_restarts: int = Field(
        3, ge=0, description="ray: how often the driver restarts a dead learner actor from the last checkpoint"
    )
    num_learners: int = Field(
        1, ge=1, description="ray: data-parallel learner processes (one torch.distributed group, each on its shard "
        "of every batch; placed by learner_resources); 1 = one learner"
    )
    learner_sharding: Literal["none", "fsdp"] = Field(
        "none", description="none: every learner holds the whole model; fsdp (FSDP2) is refused in this version"
    )
    learner_timeout_s: float = Field(
        600.0, gt=0, description="num_learners > 1: the longest a collective or one update may take before the "
        "group counts as hung and restarts from the last checkpoint"
    )
    autoscale: AutoscaleConfig | None = Field(None, description="ray: resize rollout workers by a rule; null = fixed")

    @model_validator(mode="after")
    def _learner_group(self) -> DistributionConfig:
        n = self.num_learners
        gpus = {"num_gpus": self.num_gpus, "learner_resources.num_gpus": self.learner_resources.num_gpus}
        problem = None
        if n > 1 and self.backend != "ray":
            problem = (f"distribution.num_learners: {n} places learner processes as Ray actors; set "
                       "distribution.backend: ray or num_learners: 1")
        elif n > 1 and any(v > 0 for v in gpus.values()):
            key, value = next((k, v) for k, v in gpus.items() if v > 0)
            problem = (f"distribution.{key}: {value:g} with num_learners: {n}, but a learner group's ranks train on "
                       "CPU (gloo) in this version; set it to 0 or num_learners: 1")
        elif self.learner_sharding == "fsdp":
            problem = ("distribution.learner_sharding: fsdp is not wired in this version (FSDP2 averages gradients "
                       "per rank, not per token, so N learners would not take one learner's step); use "
                       "learner_sharding: none")
        if problem is not None:  # one line naming the key, without the section echoed
            raise PydanticCustomError("run_section", "{problem}", {"problem": problem})
        return self

    @model_validator(mode="after")
    def _autoscale_fits(self) -> DistributionConfig:
        a = self.autoscale
        if a is None:
            return self
        if self.backend != "ray":
            raise ValueError("autoscale resizes Ray rollout actors; set backend: ray or remove distribution.autoscale")
        if not a.min_rollout_workers <= self.rollout_workers <= a.max_rollout_workers:
            raise ValueError(
                f"rollout_workers ({self.rollout_workers}) is the starting count and must lie within "
                f"autoscale [min_rollout_workers, max_rollout_workers] = [{a.min_rollout_workers}, "
                f"{a.max_rollout_workers}]; set rollout_workers inside that range"
            )
        return self

    @property
    def num_envs(self) -> int:
        """Total env copies: workers x envs_per_worker (or the learner's own envs when rollout_workers is 0)."""
        per = self.envs_per_worker or (8 if self.rollout_workers == 0 else 1)
        return per * max(1, self.rollout_workers)

    @property
    def envs_per_runner(self) -> int:
        return self.envs_per_worker or (8 if self.rollout_workers == 0 else 1)


class MetricSinkConfig(StrictModel):
    """One extra metric sink (polar.metrics.sinks); ``options`` go to it (wandb: project, mode; mlflow:
    tracking_uri, experiment)."""

    type: Literal["wandb", "mlflow", "otel"]
    options: dict[str, Any] = Field(default_factory=dict)


class LoggingConfig(StrictModel):
    metrics: list[str] = Field(default_factory=lambda: ["episode_reward_mean", "episode_len_mean"])
    checkpoint_freq: int = Field(10, ge=0, description="checkpoint every N learner iterations (0 = only at the end)")
    keep_checkpoints: int = Field(3, ge=1)
    tensorboard: bool = True
    progress_bar: bool = True
    log_interval: int = Field(1, ge=1, description="write metrics every N iterations")
    sigterm_grace_s: float = Field(
        30.0, ge=0, description="SIGTERM: time to finish the iteration and write a final checkpoint; after it, the "
        "run stops without one"
    )
    system_metrics_s: float = Field(
        5.0, ge=0, description="sample CPU%, RSS and I/O of the run's processes (and GPUs via NVML) this often "
        "into every metrics row as system/...; 0 = off (polar.metrics.system)")
    structured_logs: bool = Field(True, description="write JSON log lines to RUN/logs/<role>-<pid>.jsonl")
    sinks: list[MetricSinkConfig] = Field(
        default_factory=list, description="extra metric sinks (wandb, mlflow, otel); off unless listed, each needs "
        "its extra: pip install 'polar-rl[wandb]'")


class EvalConfig(StrictModel):
    episodes: int = Field(20, ge=1)
    seed: int = 10_000
    deterministic: bool = True
    at_end: bool = True
    every_n_iterations: int = Field(0, ge=0)
    num_envs: int = Field(4, ge=1, description="eval env copies stepped together")
    old_tasks: list[OldTaskConfig] = Field(
        default_factory=list, description="env variants of an old task: evaluated at the start and with every "
        "evaluation, logging old_task/return and forgetting (start - current); docs/offline.md, Continual")
