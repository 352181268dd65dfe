"""The rollout backend interface: "run these env workers somewhere and stream fragments back".

Algorithms and trainers only see this protocol; ``local`` (this package) and ``ray``
(``polar/rollout/backends/ray_backend.py``) implement it. A backend is built from the run config
alone, so it can construct envs and policies wherever its workers live::

    backend = make_backend(cfg, fragment_steps=T, seed=cfg.seed, config_dir=cfg.config_dir)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    backend.start(policy.state_dict(), version=0, policy=policy)   # spawn workers with the initial weights
    while training:
        frag = backend.next_fragment(timeout_s=...)    # first-ready fragment from any worker
        ...                                            # frag.policy_version says which weights acted
        backend.publish_weights(policy.state_dict(), version)   # after each update
    backend.close()

Contract:

- ``num_envs``: total env copies across workers; ``num_workers``: workers (0 = in the learner);
  ``observation_space`` / ``action_space``: the single-env spaces, known right after construction.
- ``start(..., policy=...)``: ``policy`` is the learner's own object; only an in-process backend uses it
  (it then acts with the learner's weights directly). Remote workers build their own from the config.
- ``next_fragment`` returns a ``Fragment`` (time-major numpy arrays, ``[T, envs_per_worker]``) as soon
  as any worker has one, tagged with ``policy_version`` and ``worker_id``; it never waits for the
  slowest worker. It raises a ``PolarError`` subclass (never hangs) when a worker fails, dies, or is
  silent for ``distribution.worker_timeout_s``.
- ``publish_weights`` makes ``state_dict`` (agent + normalizer tensors) visible to every worker
  without blocking on them; workers pick the newest version before their next fragment. Weights
  are not pickled per update (local: shared memory; ray: the object store).
- ``on_policy`` (``make_backend``; PPO's row in ``polar.trainers.registry``): a worker starts its next
  fragment only after the next ``publish_weights``, so every fragment is of the newest weights; otherwise
  each worker keeps up to 2 fragments in flight and they may be 1-2 versions old.
- ``close`` stops workers and their envs; it is safe to call twice.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from polar.types import Fragment


@runtime_checkable
class RolloutBackend(Protocol):
    num_envs: int
    num_workers: int
    observation_space: Any
    action_space: Any

    def start(self, policy_state: dict[str, torch.Tensor], version: int = 0, policy: Any = None) -> None: ...

    def publish_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None: ...

    def next_fragment(self, timeout_s: float | None = None) -> Fragment: ...

    def close(self) -> None: ...


def make_backend(cfg, fragment_steps: int, seed: int, config_dir=None, on_policy: bool = False) -> RolloutBackend:
    """The backend ``cfg.distribution.backend`` names, built from the run config alone. ``on_policy`` (PPO):
    rollout workers collect each fragment with the newest weights (no policy lag), not up to 2 fragments ahead."""
    backend = cfg.distribution.backend
    if backend == "local":
        from polar.rollout.backends.local import LocalBackend

        return LocalBackend(cfg, fragment_steps, seed, config_dir=config_dir, on_policy=on_policy)
    if backend == "ray":
        from polar.rollout.backends.ray_backend import RayBackend  # provided by the Ray backend

        return RayBackend(cfg, fragment_steps, seed, config_dir=config_dir, on_policy=on_policy)
    raise ValueError(f"unknown distribution.backend {backend!r}")
