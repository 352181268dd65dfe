"""Small config sections shared by every kind of run: distribution, logging, eval."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from polar.config.base import StrictModel


class RoleResources(StrictModel):
    num_cpus: float = 1.0
    num_gpus: float = 0.0


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

    @property
    def num_envs(self) -> int:
        """Total env copies: workers x envs_per_worker (or the learner's own envs when rollout_workers is 0)."""
        per = self.envs_per_worker or (8 if self.rollout_workers == 0 else 1)
        return per * max(1, self.rollout_workers)

    @property
    def envs_per_runner(self) -> int:
        return self.envs_per_worker or (8 if self.rollout_workers == 0 else 1)


class LoggingConfig(StrictModel):
    metrics: list[str] = Field(default_factory=lambda: ["episode_reward_mean", "episode_len_mean"])
    checkpoint_freq: int = Field(10, ge=0, description="checkpoint every N learner iterations (0 = only at the end)")
    keep_checkpoints: int = Field(3, ge=1)
    tensorboard: bool = True
    progress_bar: bool = True
    log_interval: int = Field(1, ge=1, description="write metrics every N iterations")


class EvalConfig(StrictModel):
    episodes: int = Field(20, ge=1)
    seed: int = 10_000
    deterministic: bool = True
    at_end: bool = True
    every_n_iterations: int = Field(0, ge=0)
    num_envs: int = Field(4, ge=1, description="eval env copies stepped together")
