"""What the polar-vs-SB3 trial benchmarks share (``atari_ppo_vs_sb3.py``, ``mujoco_sac_vs_sb3.py``,
``off_policy_vs_sb3.py``): one copy, so that every script times, runs and tabulates its trials the same way.

Each trial is a fresh ``python -c`` process, its code put together from the pieces below and the script's
own (config, algorithm, evaluation loop); it prints one JSON line, which ``spawn_trial`` reads. The pieces
are plain code, run in the order they are joined:

- ``TRIAL_HEAD``: the trial's arguments as ``A``, numpy and gymnasium;
- ``TRIAL_TOOLS``: the first-env-step clock (the env class's ``step``, patched identically on both sides),
  ``cpu_s()``, ``timed(fn)`` (adds fn's call time to ``UPDATE["s"]``, its calls to ``UPDATE["n"]``) and
  ``report(t_end, cpu, act, **counts)``, which evaluates ``act`` with the script's ``evaluate`` and prints
  the JSON line;
- ``EVALUATE_GYM``: ``evaluate(act)`` on ``gym.make(A["env_id"])``, deterministic episodes seeded
  ``A["eval_seed"] + i``;
- ``POLAR_TOOLS``: ``bench_loop(cfg, timed_method)`` (``--threads`` torch threads, the learner's update
  timed); ``POLAR_OFF_POLICY_CFG``: the off-policy ``cfg``; ``POLAR_TRAIN``: trains ``bench_loop(cfg, *BENCH)`` and
  takes ``t_end``, ``cpu`` and ``policy``;
- ``SB3_LEARN``: times ``model.train``, trains ``model`` and takes ``t_end`` and ``cpu``.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
SIDES = (("polar", "polar"), ("sb3", "SB3"))  # (key in the results, name in the tables)
JOBS_HELP = ("trials run at once (default 1: one at a time). 2 runs a seed's polar and SB3 trials together, "
             "2 x seeds runs all: on a shared, loaded box the two sides then see the same load")

TRIAL_HEAD = r"""
import importlib, json, resource, sys, time
A = json.loads(sys.argv[1])
import numpy as np, gymnasium as gym
"""

TRIAL_TOOLS = r"""
FIRST_STEP = []
def _patch_first_step(env_id):
    mod, _, name = gym.spec(env_id).entry_point.partition(":")
    cls = getattr(importlib.import_module(mod), name)
    orig = cls.step
    def step(self, action):
        FIRST_STEP.append(time.time())
        cls.step = orig
        return orig(self, action)
    cls.step = step
_patch_first_step(A["env_id"])
def cpu_s():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
UPDATE = {"s": 0.0, "n": 0}
def timed(fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            UPDATE["s"] += time.perf_counter() - t
            UPDATE["n"] += 1
    return wrapper
def report(t_end, cpu, act, **counts):
    print(json.dumps({"t_end": t_end, "t_first_step": FIRST_STEP[0] if FIRST_STEP else None, "cpu_s": cpu,
                      **counts, "eval_returns": evaluate(act)}))
"""

EVALUATE_GYM = r"""
def evaluate(act):
    env = gym.make(A["env_id"])
    space = env.action_space
    returns = []
    for i in range(A["eval_episodes"]):
        obs, _ = env.reset(seed=A["eval_seed"] + i)
        ret, done = 0.0, False
        while not done:
            a = act(obs)
            a = int(a) if isinstance(space, gym.spaces.Discrete) else np.clip(a, space.low, space.high)
            obs, r, term, trunc, _ = env.step(a)
            ret += float(r)
            done = term or trunc
        returns.append(ret)
    env.close()
    return returns
"""

POLAR_TOOLS = r"""
import tempfile
import torch
from polar.rollout.runner import obs_to_tensor
from polar.trainers.run_dir import RunDir
# the composed loop of cfg with its algorithm's timed_method timed; on_fragment(frag) sees every fragment the
# collector takes (before the loop counts it)
def bench_loop(cfg, timed_method, on_fragment=None):
    from polar.trainers.build import compose
    loop = compose(cfg, RunDir.create("bench", tempfile.mkdtemp()))
    torch.set_num_threads(A["threads"])  # compose sets 1; --threads applies to both sides alike
    learner = loop.learner.algorithm
    setattr(learner, timed_method, timed(getattr(learner, timed_method)))
    if on_fragment is not None:
        env = getattr(loop.collector, "env", loop.collector)
        fetch = env.next_fragment
        def next_fragment():
            frag = fetch()
            on_fragment(frag)
            return frag
        env.next_fragment = next_fragment
    return loop
"""

POLAR_OFF_POLICY_CFG = r"""
from polar.config import load_config
overrides = [f"seed={A['seed']}", f"total_env_steps={A['steps']}", "logging.tensorboard=false",
             "logging.checkpoint_freq=0", "logging.progress_bar=false", "eval.at_end=false",
             "policy.kwargs.save_replay_buffer=false", f"agent.hidden_sizes={json.dumps(A['net_arch'])}",
             "distribution.rollout_workers=0", "distribution.envs_per_worker=1"]
overrides += [f"policy.kwargs.{k}={json.dumps(v)}" for k, v in A["hparams"].items()]
cfg = load_config(A["config"], overrides)
"""

POLAR_TRAIN = r"""
trainer = bench_loop(cfg, *BENCH)
res = trainer.train()
t_end, cpu = time.time(), cpu_s()
policy = trainer.learner.parts.policy
"""

SB3_LEARN = r"""
model.train = timed(model.train)
model.learn(total_timesteps=A["steps"])
t_end, cpu = time.time(), cpu_s()
"""


class TrialRun(NamedTuple):
    out: dict  # the trial's JSON line
    t0: float  # time.time() just before the process was spawned
    first_step: float  # time of the first env step (t0 when the clock saw none)
    from_first_step_s: float  # first env step to the end of training


def spawn_trial(code: str, args: dict, threads: int, timeout_s: float, label: str) -> TrialRun:
    """Runs one trial process with ``threads`` OpenMP/MKL threads, timed from just before its spawn, so that
    interpreter start, imports and env creation count."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                       timeout=timeout_s, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{label} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    first = out["t_first_step"] if out["t_first_step"] is not None else t0
    return TrialRun(out, t0, first, out["t_end"] - first)


def trial_plan(seeds: list[int] | range) -> list[tuple[str, int]]:
    """(side, seed) in run order: polar first on even seeds, SB3 first on odd ones, so neither always goes first."""
    return [(which, seed) for seed in seeds for which in (("polar", "sb3") if seed % 2 == 0 else ("sb3", "polar"))]


def run_trials(res: dict, seeds: list[int], jobs: int, trial: Callable[[str, int], dict], line: str,
               out: Path | None) -> None:
    """Runs ``trial(side, seed)`` for the whole plan, up to ``jobs`` at once; in plan order, appends each result
    to ``res[side]``, prints it with ``line`` and rewrites ``out`` (when given), so a cut-short run keeps its trials."""
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for which, r in pool.map(lambda t: (t[0], trial(*t)), trial_plan(seeds)):  # the trials overlap up to jobs
            res[which].append(r)
            print(line.format(which=which, **r), file=sys.stderr, flush=True)
            if out:
                out.write_text(json.dumps(res, indent=1))


def mean_of_all(xs: list) -> float | None:
    """The mean, or None when there is nothing to average or a trial has no value."""
    return statistics.fmean(xs) if xs and all(x is not None for x in xs) else None


def cell(fmt: str, value: float | None) -> str:
    return "n/a" if value is None else fmt.format(value)


def ratio_cell(key: str, a: float | None, b: float | None, diff_fmt: str) -> str:
    """polar's mean against SB3's: a difference for the return (it can be negative), nothing for the update
    share, else polar / SB3."""
    if key == "eval_mean":
        return "n/a" if a is None or b is None else diff_fmt.format(a - b)
    if key == "update_share":
        return ""
    return "n/a" if not a or not b else f"{a / b:.2f}"


def markdown_lines(header: list[str], rows: list[list[str]]) -> list[str]:
    """Header, separator and rows, padded to the widest cell: the first two columns left-aligned, the rest right."""
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + " |"

    sep = "|" + "|".join("-" * (w + 1) + ":" if i >= 2 else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return [line(header), sep, *map(line, rows)]


def trial_table(res: dict, title: str, cols: list[tuple[str, str, str]], diff_fmt: str) -> str:
    """Markdown table: one row per trial, the per-side means (n/a where a trial has none), and polar / SB3 of
    the means. ``cols``: (header, result key, format)."""
    header = ["framework", "seed"] + [c[0] for c in cols]
    rows, means = [], {}
    for which, name in SIDES:
        for r in res[which]:
            rows.append([name, str(r["seed"])] + [cell(fmt, r[k]) for _, k, fmt in cols])
    for which, name in SIDES:
        m = {k: mean_of_all([r[k] for r in res[which]]) for _, k, _ in cols}
        means[which] = m
        rows.append([f"**{name} mean**", ""] + [cell(fmt, m[k]) for _, k, fmt in cols])
    rows.append(["**polar / SB3**", ""] + [ratio_cell(k, means["polar"][k], means["sb3"][k], diff_fmt)
                                           for _, k, _ in cols])
    return "\n".join([title, *markdown_lines(header, rows)])


def versions(*extra: tuple[str, str]) -> str:
    """The versions line: Python, torch, gymnasium, then ``extra``'s (name, module) packages, numpy, SB3, CPUs."""
    import gymnasium
    import numpy
    import stable_baselines3
    import torch

    more = "".join(f"{name} {importlib.import_module(module).__version__}, " for name, module in extra)
    return (f"Python {platform.python_version()}, torch {torch.__version__}, gymnasium {gymnasium.__version__}, "
            f"{more}numpy {numpy.__version__}, stable-baselines3 {stable_baselines3.__version__}, {os.cpu_count()} CPUs")
