"""The top-level run config: one YAML file per run (``polar run --config FILE``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from polar.config.agent import AgentConfig, BuiltinAgentConfig
from polar.config.agentic import ModelConfig, SessionsConfig, TrajectoryConfig, VerifierConfig
from polar.config.base import StrictModel
from polar.config.gateway import GatewayConfig
from polar.config.grpo import SFTWarmupConfig
from polar.config.harness import HarnessConfig
from polar.config.llm_agent import TaskSource, overlapping_seeds
from polar.config.policy import PolicyConfig
from polar.config.sections import DistributionConfig, EvalConfig, LoggingConfig


class RunConfig(StrictModel):
    name: str = "run"
    harness: HarnessConfig
    agent: AgentConfig = Field(default_factory=BuiltinAgentConfig)
    policy: PolicyConfig
    distribution: DistributionConfig = Field(default_factory=DistributionConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    total_env_steps: int = Field(100_000, ge=1)
    seed: int = 0
    stop_reward: float | None = Field(None, description="stop early once the 100-episode training mean return reaches this")
    nonfinite: Literal["fail", "skip"] = Field(
        "fail", description="NaN/inf in observations or rewards: fail naming the source, or skip the fragment and "
        "count it (nonfinite_skipped_fragments); a non-finite loss always fails")

    # agentic runs (harness.type == agent)
    tasks: str | TaskSource | None = Field(None, description="a tasks JSONL, or a generated source (seeds, ...)")
    verifier: VerifierConfig | None = None
    model: ModelConfig | None = None
    trajectory: TrajectoryConfig = Field(default_factory=TrajectoryConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    eval_tasks: str | TaskSource | None = Field(
        None, description="held-out tasks (JSONL or a generated source) scored at start/end of training")
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    sft_warmup: SFTWarmupConfig | None = None

    _config_dir: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _disjoint_tasks(self) -> RunConfig:
        why = overlapping_seeds(self.tasks, self.eval_tasks)
        if why:
            raise ValueError(why)
        return self

    @property
    def config_dir(self) -> Path:
        """Directory of the YAML file; user modules resolve here first, then the working directory."""
        return self._config_dir or Path.cwd()
