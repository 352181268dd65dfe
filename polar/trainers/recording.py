"""``polar eval --record``: episodes played one at a time and kept frame by frame in the run directory::

    RUN/episodes/<tag>/index.json          {tag, checkpoint, env_steps, iteration, harness, seed, deterministic,
                                            episodes: [{id, seed, return, length, success, frames}]}
    RUN/episodes/<tag>/<id>/steps.jsonl    one object per frame: {t, action, reward, terminated, truncated,
                                            frame: "f_00000.png"} or {..., text: "..."}; t=0 is the reset,
                                            with action and reward null; row t holds the action taken at
                                            t-1 and the reward it earned
    RUN/episodes/<tag>/<id>/f_00000.png    RGB frames (PNG)

Frames come from, in order: an RGB image in the observation (a uint8 (H, W, 3) array, e.g. the key-door
connector's ``pixels: true``), the Gymnasium env's ``render_mode="rgb_array"``, else a text render of the
observation. JSON and PNG only: nothing here is pickled.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from polar.config.harness import GymnasiumHarnessConfig
from polar.config.run import EnvHarnessConfig
from polar.config.secrets import redact
from polar.rollout.episodes import ActingPolicy, EnvSlots, EpisodePlan, PolicyActor, Step, iter_episodes
from polar.trainers.run_dir import atomic_write_text

log = logging.getLogger(__name__)


def _image_key(obs: Any) -> str | None:
    """The key of an RGB image in a dict observation, "" for an image observation, else None."""
    def is_img(a: Any) -> bool:
        a = np.asarray(a)
        return a.dtype == np.uint8 and a.ndim == 3 and a.shape[-1] == 3
    if isinstance(obs, dict):
        return next((k for k, v in obs.items() if is_img(v)), None)
    return "" if is_img(obs) else None


def _text(obs: Any) -> str:
    def fmt(a: Any) -> str:
        a = np.asarray(a)
        return np.array2string(a, precision=3, suppress_small=True, max_line_width=100, threshold=400)
    if isinstance(obs, dict):
        return "\n".join(f"{k}: {fmt(v)}" for k, v in obs.items())
    return fmt(obs)


def _jsonable(a: Any) -> Any:
    a = np.asarray(a)
    return a.item() if a.ndim == 0 else a.tolist()


def record_episodes(policy: ActingPolicy, harness_cfg: EnvHarnessConfig, run_path: Path, episodes: int, seed: int,
                    deterministic: bool = True, config_dir: Path | None = None, meta: dict[str, Any] | None = None,
                    max_steps: int = 10_000) -> Path:
    """Play ``episodes`` episodes (seeds ``seed``, ``seed + 1``, ...) on one fresh env and record them under
    ``run_path/episodes/<tag>/``; returns that folder."""
    from polar.harness import make_env

    meta = dict(meta or {})
    tag = f"rec_{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(run_path) / "episodes" / tag
    n = 1
    while out.exists():
        n += 1
        out = out.with_name(f"{tag}-{n}")
    out.mkdir(parents=True)
    render = isinstance(harness_cfg, GymnasiumHarnessConfig)
    if isinstance(harness_cfg, GymnasiumHarnessConfig):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame draws off-screen; no display, no audio
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        harness_cfg = harness_cfg.model_copy(update={"kwargs": {**harness_cfg.kwargs, "render_mode": "rgb_array"}})
    # one plain env: no autoreset, so the final frame is the final state
    slots = EnvSlots([make_env(harness_cfg, config_dir)])
    frames = _Frames(out, slots.envs[0] if render else None)
    summaries = []
    try:
        for r in iter_episodes(PolicyActor(policy), slots, EpisodePlan.seeded(range(seed, seed + episodes)),
                               deterministic=deterministic, max_episode_steps=max_steps, observer=frames):
            ep_id, kinds = frames.finish(r.episode)
            success = None if r.cut else r.success  # the env's, when it ended the episode itself
            summaries.append({"id": ep_id, "seed": r.seed, "return": r.ret, "length": r.length,
                              "success": success, "frames": "png" if kinds == {"png"} else "text"})
    finally:
        slots.close()
    # the harness as config.resolved.yaml has it: a connector token or a credential in its env: never on disk
    index = {"tag": tag, **meta, "harness": redact(harness_cfg), "seed": seed,
             "deterministic": deterministic, "created": time.time(), "episodes": summaries}
    atomic_write_text(out / "index.json", json.dumps(index, indent=2, default=str))
    log.info("recorded %d episodes in %s", len(summaries), out)
    return out


class _Frames:
    """The episode loop's observer: one folder per episode, a frame per reset and step, steps.jsonl at its end."""

    def __init__(self, out: Path, env: gym.Env[Any, Any] | None) -> None:
        self.out, self.env = out, env
        self.rows: list[dict[str, Any]] = []
        self.kinds: set[str] = set()

    def _dir(self, episode: int) -> Path:
        return self.out / f"ep_{episode:05d}"

    def on_reset(self, slot: int, episode: int, seed: int | None, obs: Any) -> None:
        self._dir(episode).mkdir()
        self.rows, self.kinds = [], set()
        first = {"t": 0, "action": None, "reward": None, "terminated": False, "truncated": False}
        _frame(self.env, self._dir(episode), 0, obs, first, self.rows, self.kinds)

    def on_step(self, slot: int, step: Step) -> None:
        _frame(self.env, self._dir(step.episode), step.t, step.obs,
               {"t": step.t, "action": _jsonable(step.action), "reward": float(step.reward),
                "terminated": bool(step.terminated), "truncated": bool(step.truncated)}, self.rows, self.kinds)

    def finish(self, episode: int) -> tuple[str, set[str]]:
        """Write the episode's steps.jsonl; returns its id and frame kinds."""
        (self._dir(episode) / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        return self._dir(episode).name, self.kinds


def _frame(env: gym.Env[Any, Any] | None, ep_dir: Path, t: int, obs: Any, row: dict[str, Any],
           rows: list[dict[str, Any]], kinds: set[str]) -> None:
    """Add frame ``t`` to ``rows``: a PNG from an image in ``obs`` or ``env.render()``, else text."""
    from PIL import Image

    key = _image_key(obs)
    img = (obs[key] if key else obs) if key is not None else (env.render() if env is not None else None)
    if img is not None:
        kinds.add("png")
        row["frame"] = name = f"f_{t:05d}.png"
        Image.fromarray(np.ascontiguousarray(img, dtype=np.uint8)).save(ep_dir / name)
    else:
        kinds.add("text")
        row["text"] = _text(obs)
    rows.append(row)
