"""SAC hyperparameters (``policy: {type: sac, kwargs: {...}}``). Names and defaults follow Stable-Baselines3.

``ent_coef: auto`` learns the entropy coefficient towards ``target_entropy`` (``auto`` = -dim(action));
``auto_0.1`` does the same starting from 0.1; a number fixes it.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from polar.config.base import NStepReturnKwargs

_AUTO = re.compile(r"^auto(_\d*\.?\d+(e-?\d+)?)?$")


class SACKwargs(NStepReturnKwargs):
    # replay (next_obs in fragments): polar.rollout.runner keeps each step's next observation
    keeps_next_obs: ClassVar[bool] = True
    network: ClassVar[str] = "off_policy"
    actions: ClassVar[str] = "box"  # the action space its networks take (polar.models.off_policy)
    default_hidden: ClassVar[list[int]] = [256, 256]  # SB3's default hidden sizes

    learning_rate: float = Field(3e-4, gt=0)
    lr_schedule: Literal["constant", "linear"] = Field("constant", description="linear: decays to 0 at total_env_steps")
    buffer_size: int = Field(1_000_000, ge=1, description="replay capacity in transitions")
    learning_starts: int = Field(100, ge=0, description="env steps of uniform-random actions before training")
    batch_size: int = Field(256, ge=1)
    tau: float = Field(0.005, gt=0, le=1, description="Polyak coefficient of the target critics")
    gamma: float = Field(0.99, ge=0, le=1)
    n_step_return: int = Field(1, ge=1, description="n-step returns: rewards summed over up to n steps, bootstrap * gamma**n")
    train_freq: int = Field(1, ge=1, description="steps per env between training phases (the fragment length)")
    gradient_steps: int | None = Field(
        None, ge=-1, description="gradient steps per training phase; None = one per train_freq transitions in total "
        "(1 with 1 env, as in SB3; num_envs with more, so the ratio holds); -1 = one per transition collected"
    )
    target_update_interval: int = Field(1, ge=1, description="gradient steps between target-critic updates")
    ent_coef: float | str = Field("auto", description="'auto', 'auto_<init>' or a fixed coefficient")
    target_entropy: float | Literal["auto"] = "auto"
    max_grad_norm: float | None = Field(None, gt=0, description="clip gradients of every network; None = off (SB3)")
    save_replay_buffer: bool = Field(True, description="checkpoint the replay buffer too, so a resumed run continues "
                                     "exactly (one file per kept checkpoint: keep_checkpoints copies on disk)")

    @field_validator("ent_coef")
    @classmethod
    def _ent_coef_form(cls, v: float | str) -> float | str:
        if isinstance(v, str) and not _AUTO.match(v):
            raise ValueError(f"ent_coef must be a number, 'auto' or 'auto_<initial value>' (e.g. auto_0.1); got {v!r}")
        if isinstance(v, str) and "_" in v and float(v.split("_", 1)[1]) <= 0:
            raise ValueError(f"ent_coef {v!r}: the initial value after 'auto_' must be > 0 (it is learned in log space)")
        if isinstance(v, (int, float)) and v <= 0:
            raise ValueError(f"a fixed ent_coef must be > 0; got {v}")
        return v
