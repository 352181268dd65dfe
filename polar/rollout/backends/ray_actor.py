"""The rollout worker as a Ray actor: ``envs_per_worker`` env copies stepped by one ``EnvRunner``.

It is the same ``EnvRunner`` the local backend runs in its worker processes; only the transport
differs. Weights ride with a ``sample`` call only when the worker does not have that version yet:
inline in the call when small (a put into the object store costs more than the bytes), else as one
object-store reference shared by every worker, which Ray resolves to zero-copy numpy arrays before
the call runs (``polar.rollout.backends.ray_pool``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch


def state_to_numpy(state_dict: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A state dict as plain numpy arrays: zero-copy in Ray's object store, no torch pickling."""
    return {k: v.detach().cpu().numpy() for k, v in state_dict.items()}


class RolloutWorker:
    """Builds env copies and a policy from the run config; ``sample`` returns one ``Fragment``."""

    def __init__(self, cfg_data: dict[str, Any], config_dir: str | None, worker_id: int, num_envs: int, seed: int) -> None:
        torch.set_num_threads(1)
        from polar.config import validate
        from polar.config.run import RunConfig
        from polar.harness import make_vector_env
        from polar.models.policy import build_policy
        from polar.rollout.runner import EnvRunner, runner_options

        cfg = validate(RunConfig, cfg_data, source="config (rollout worker)")
        cdir = Path(config_dir) if config_dir else None
        self.worker_id = worker_id
        env = make_vector_env(cfg.harness, num_envs, seed=seed, config_dir=cdir, worker_index=worker_id + 1)
        self.policy = build_policy(cfg, env.single_observation_space, env.single_action_space, cdir)
        self.policy.eval()
        self.runner = EnvRunner(env, self.policy, seed=seed, **runner_options(cfg))
        self.version = -1

    def ready(self) -> dict[str, Any]:
        import ray

        return {"worker_id": self.worker_id, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    def sample(self, num_steps: int, version: int, weights: dict[str, np.ndarray] | None):
        """Collect ``num_steps`` steps of every env, first loading ``weights`` (version ``version``) if given.

        ``weights`` is None when this worker already has ``version`` (the pool sends each version once)."""
        if weights is not None and version != self.version:
            self.policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
            self.version = version
        return self.runner.collect(num_steps, policy_version=self.version, worker_id=self.worker_id)

    def close(self) -> None:
        self.runner.close()
