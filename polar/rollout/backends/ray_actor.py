"""The rollout worker as a Ray actor: ``envs_per_worker`` env copies stepped by one ``EnvRunner``.

It is the same ``EnvRunner`` the local backend runs in its worker processes; only the transport
differs. Weights arrive as an object-store reference tagged with a policy version, and are loaded
only when the version changes, so a broadcast costs one ``ray.put`` however many workers read it.
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

    def _load(self, version: int, weights_box: list) -> None:
        if version == self.version or not weights_box:
            return
        import ray

        arrays = ray.get(weights_box[0])
        self.policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
        self.version = version

    def sample(self, num_steps: int, version: int, weights_box: list):
        """Collect ``num_steps`` steps of every env with the newest weights (``weights_box`` = [ObjectRef])."""
        self._load(version, weights_box)
        return self.runner.collect(num_steps, policy_version=self.version, worker_id=self.worker_id)

    def close(self) -> None:
        self.runner.close()
