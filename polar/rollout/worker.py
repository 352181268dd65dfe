"""Rollout worker process for the local backend: envs + a policy replica + an ``EnvRunner``.

Weights arrive through shared-memory tensors (copied in when the shared version changes);
fragments leave through per-worker shared-memory slots (double-buffered), so the queue only
carries slot ids and a few numbers per fragment. ``on_policy``: one slot, taken before a fragment is
collected, so the worker waits for the learner's next weights (``polar.rollout.backends.local``).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polar.types import Fragment

log = logging.getLogger(__name__)

ARRAY_FIELDS = ("actions", "log_probs", "values", "rewards", "terminated", "truncated", "episode_starts",
                "trunc_values", "last_values")
META_FIELDS = ("policy_version", "worker_id", "episode_returns", "episode_lengths", "episode_successes",
               "connector_process_restarts", "connector_copies_restarted", "obs_moments", "return_moments", "trace_id",
               "collect_s")


def fragment_arrays(frag: Fragment) -> dict[str, np.ndarray]:
    """Flatten a fragment's arrays to ``name -> ndarray`` (``obs/<key>``, ``state/<i>``)."""
    out = {k: getattr(frag, k) for k in ARRAY_FIELDS}
    if isinstance(frag.obs, dict):
        out.update({f"obs/{k}": v for k, v in frag.obs.items()})
    else:
        out["obs"] = frag.obs
    if isinstance(frag.next_obs, dict):
        out.update({f"next_obs/{k}": v for k, v in frag.next_obs.items()})
    elif frag.next_obs is not None:
        out["next_obs"] = frag.next_obs
    st = frag.initial_state
    if st is not None:
        parts = st if isinstance(st, (tuple, list)) else (st,)
        out.update({f"state/{i}": np.asarray(p) for i, p in enumerate(parts)})
        out["state_is_tuple"] = np.array(isinstance(st, (tuple, list)))
    return out


def fragment_from_arrays(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Fragment:
    obs_keys = [k for k in arrays if k.startswith("obs/")]
    obs = {k[4:]: arrays[k] for k in obs_keys} if obs_keys else arrays["obs"]
    next_keys = [k for k in arrays if k.startswith("next_obs/")]
    next_obs = {k[9:]: arrays[k] for k in next_keys} if next_keys else arrays.get("next_obs")
    state = None
    state_keys = sorted((k for k in arrays if k.startswith("state/")), key=lambda k: int(k[6:]))
    if state_keys:
        parts = [arrays[k] for k in state_keys]
        state = tuple(parts) if bool(arrays["state_is_tuple"]) else parts[0]
    return Fragment(obs=obs, actions=arrays["actions"], log_probs=arrays["log_probs"], values=arrays["values"],
                    rewards=arrays["rewards"], terminated=arrays["terminated"], truncated=arrays["truncated"],
                    episode_starts=arrays["episode_starts"], trunc_values=arrays["trunc_values"],
                    last_values=arrays["last_values"], initial_state=state, next_obs=next_obs, **meta)


def _free_slot(free_q: Any, stop: Any) -> int | None:
    """The next free slot index, or None once ``stop`` is set."""
    while not stop.is_set():
        try:
            return int(free_q.get(timeout=0.5))
        except queue.Empty:
            continue
    return None


def worker_main(worker_id: int, cfg_data: dict, config_dir: str | None, seed: int, fragment_steps: int,
                weights: dict[str, torch.Tensor], version, lock, out_q, free_q, stop, learner_alive,
                run_dir: str | None = None, on_policy: bool = False) -> None:
    """Entry point of one worker process. Reports any failure on ``out_q`` and exits.

    ``learner_alive`` is the read end of a pipe only the learner writes to: its EOF means the learner is
    gone (even SIGKILLed), and the worker then kills its connectors and exits. Ctrl-C reaches the whole
    foreground process group, so the worker ignores SIGINT: the learner decides when workers stop
    (``stop``), after it has written its final checkpoint.
    """
    from polar.harness.connector.process import kill_leftovers
    from polar.lifetime import exit_when_closed

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_when_closed(learner_alive, before_exit=kill_leftovers, name="polar-learner-watch")
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    runner = None
    if run_dir:  # JSON log lines in RUN/logs/rollout_worker-<pid>.jsonl (polar.metrics.logs)
        from polar.metrics.logs import install_run_logging

        install_run_logging(run_dir, "rollout_worker")
    try:
        from polar.config.base import validate
        from polar.config.run import RunConfig
        from polar.harness import make_vector_env
        from polar.models.policy import build_policy
        from polar.rollout.runner import EnvRunner, runner_options

        cfg = validate(RunConfig, cfg_data, source="run config (worker)")
        cdir = Path(config_dir) if config_dir else None
        cfg._config_dir = cdir
        n = cfg.distribution.envs_per_runner
        env = make_vector_env(cfg.harness, n, seed=seed, config_dir=cdir, worker_index=worker_id + 1)
        policy = build_policy(cfg, env.single_observation_space, env.single_action_space, cdir)
        runner = EnvRunner(env, policy, seed=seed, **runner_options(cfg))
        local_version = -1
        slots: list[dict[str, torch.Tensor]] | None = None
        while not stop.is_set():
            # on_policy: the slot comes back with the next weights, so wait for it before collecting
            slot = _free_slot(free_q, stop) if on_policy else None
            if on_policy and slot is None:
                break
            if version.value != local_version:
                with lock:
                    policy.load_state_dict(weights)
                    local_version = int(version.value)
            frag = runner.collect(fragment_steps, local_version, worker_id)
            log.debug("fragment %s: %d env steps in %.3fs (policy version %d)", frag.trace_id, frag.env_steps,
                      frag.collect_s, local_version, extra={"trace_id": frag.trace_id})
            arrays = fragment_arrays(frag)
            if slots is None:
                slots = [{k: torch.from_numpy(np.ascontiguousarray(v)).clone().share_memory_() for k, v in arrays.items()}
                         for _ in range(1 if on_policy else 2)]
                out_q.put(("slots", worker_id, slots))
            if slot is None:
                slot = _free_slot(free_q, stop)
            if slot is None:
                break
            for k, v in arrays.items():
                slots[slot][k].numpy()[...] = v
            meta = {k: getattr(frag, k) for k in META_FIELDS}
            out_q.put(("fragment", worker_id, slot, meta))
    except BaseException as e:  # report everything; the learner turns it into a PolarError
        out_q.put(("error", worker_id, type(e).__name__, str(e), traceback.format_exc()))
    finally:
        if runner is not None:
            try:
                runner.close()
            except Exception:
                pass
