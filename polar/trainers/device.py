"""Where a learner's tensors live: one rule for every trainer (PPO/APPO/DQN/SAC/GRPO/SFT).

CUDA when the config asks for GPUs (``distribution.num_gpus >= 1``) and CUDA is present here; CPU
otherwise. A run that asked for a GPU but gets CPU says so once per process (not once per learner or
per restart), so the fallback is visible without flooding a log.
"""

from __future__ import annotations

import logging

import torch

from polar.algorithms.optim import module_device

log = logging.getLogger(__name__)

_logged: set[str] = set()


def learner_device(num_gpus: float, cuda_available: bool | None = None) -> torch.device:
    """The device a learner trains on. ``cuda_available`` defaults to ``torch.cuda.is_available()``
    (tests pass it to check the rule without a GPU)."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if num_gpus >= 1 and cuda_available:
        return torch.device("cuda")
    if num_gpus >= 1:
        _log_once(f"distribution.num_gpus={num_gpus:g} but CUDA is not available here; the learner runs on CPU")
    elif num_gpus > 0:
        _log_once(f"distribution.num_gpus={num_gpus:g} is a fraction of a GPU; the learner runs on CPU "
                  "(set num_gpus: 1 to train on CUDA)")
    return torch.device("cpu")


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.warning(message)


def learner_copy(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The module a learner trains on ``device``: ``module`` itself when it is already there (a CPU learner
    trains the acting policy in place), else a copy moved there (the acting copy stays on CPU for the rollout
    workers, in-process envs and evaluation; :func:`copy_weights` brings it the learner's weights)."""
    if module_device(module) == device:
        return module
    import copy

    return copy.deepcopy(module).to(device)


@torch.no_grad()
def copy_weights(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """``src``'s parameters and buffers into ``dst`` in place (across devices); a no-op when they are one module."""
    if dst is src:
        return
    dst_state = dst.state_dict()
    for name, value in src.state_dict().items():
        dst_state[name].copy_(value)
