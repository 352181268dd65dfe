"""DQN hyperparameters (``policy: {type: dqn, kwargs: {...}}``). Names and defaults follow Stable-Baselines3.

Counts are in env steps (transitions), whatever the number of envs: ``train_freq: 4`` with 8 envs
collects 4 steps of each env (32 transitions) between training phases, as in SB3. SB3 then makes one
gradient step (``gradient_steps=1``), so its 8-env run learns from 8x fewer updates per transition than
its 1-env run; polar's default (``gradient_steps: None``) makes one per ``train_freq`` transitions in
total (8 per phase here), SB3's single-env ratio whatever the env count.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from polar.config.base import NStepReturnKwargs


class DQNKwargs(NStepReturnKwargs):
    # replay (next_obs in fragments): polar.rollout.runner keeps each step's next observation
    keeps_next_obs: ClassVar[bool] = True
    network: ClassVar[str] = "off_policy"
    actions: ClassVar[str] = "discrete"  # the action space its networks take (polar.models.off_policy)
    default_hidden: ClassVar[list[int]] = [64, 64]  # SB3's default hidden sizes

    learning_rate: float = Field(1e-4, gt=0)
    lr_schedule: Literal["constant", "linear"] = Field("constant", description="linear: decays to 0 at total_env_steps")
    buffer_size: int = Field(1_000_000, ge=1, description="replay capacity in transitions")
    learning_starts: int = Field(100, ge=0, description="env steps of random-epsilon collection before training")
    batch_size: int = Field(32, ge=1)
    tau: float = Field(1.0, gt=0, le=1, description="target update coefficient: 1 = hard copy")
    gamma: float = Field(0.99, ge=0, le=1)
    n_step_return: int = Field(1, ge=1, description="n-step returns: rewards summed over up to n steps, bootstrap * gamma**n")
    train_freq: int = Field(4, ge=1, description="steps per env between training phases (the fragment length)")
    gradient_steps: int | None = Field(
        None, ge=-1, description="gradient steps per training phase; None = one per train_freq transitions in total "
        "(1 with 1 env, as in SB3; num_envs with more, so the ratio holds); -1 = one per transition collected"
    )
    target_update_interval: int = Field(10_000, ge=1, description="env steps between target-network updates")
    exploration_fraction: float = Field(0.1, ge=0, le=1, description="share of total_env_steps over which epsilon decays")
    exploration_initial_eps: float = Field(1.0, ge=0, le=1)
    exploration_final_eps: float = Field(0.05, ge=0, le=1)
    max_grad_norm: float = Field(10.0, gt=0)
    double_q: bool = Field(False, description="Double DQN: the online net picks the next action, the target net scores it")
    prioritized_replay: bool = Field(False, description="proportional prioritized replay (Schaul et al. 2016)")
    prioritized_replay_alpha: float = Field(0.6, ge=0)
    prioritized_replay_beta0: float = Field(0.4, ge=0, le=1, description="importance-weight exponent, annealed to 1")
    prioritized_replay_eps: float = Field(1e-6, gt=0)
    save_replay_buffer: bool = Field(True, description="checkpoint the replay buffer too, so a resumed run continues "
                                     "exactly (one file per kept checkpoint: keep_checkpoints copies on disk)")
