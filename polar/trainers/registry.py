"""Which trainer runs which ``policy.type`` (one table; ``polar.trainers.build`` and the Ray learner actor read it).

Adding an algorithm: its config (``polar/config/<algo>.py``, joined in ``polar.config.policy``), its losses
and learner (``polar/algorithms/<algo>.py``), and one row here naming the trainer that feeds it batches.
"""

from __future__ import annotations

from polar.config.run import RunConfig
from polar.errors import ConfigError
from polar.trainers.env import EnvTrainer
from polar.trainers.off_policy import OffPolicyTrainer
from polar.trainers.offline import OfflineTrainer
from polar.trainers.on_policy import OnPolicyTrainer

ENV_TRAINERS: dict[str, type[EnvTrainer] | type[OfflineTrainer]] = {
    "ppo": OnPolicyTrainer,
    "appo": OnPolicyTrainer,
    "dqn": OffPolicyTrainer,
    "sac": OffPolicyTrainer,
    "bc": OfflineTrainer,  # from a dataset (policy.kwargs.dataset), no env interaction but evaluation
    "iql": OfflineTrainer,
    "cql": OfflineTrainer,
}
AGENT_ALGORITHMS = ("grpo", "sft")  # agent runs, polar.trainers.agentic_run.build_agent_loop


def trainer_class(cfg: RunConfig) -> type[EnvTrainer] | type[OfflineTrainer]:
    """The env trainer for ``cfg.policy.type`` (``OffPolicyTrainer`` for DQN/SAC, ``OnPolicyTrainer`` for PPO/APPO)."""
    cls = ENV_TRAINERS.get(cfg.policy.type)
    if cls is None:
        raise ConfigError(f"policy.type {cfg.policy.type!r}: env harnesses train with "
                          f"{', '.join(map(repr, ENV_TRAINERS))}; {' and '.join(AGENT_ALGORITHMS)} need harness.type: agent")
    return cls
