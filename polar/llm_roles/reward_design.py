"""An LLM as reward designer (Eureka-style): propose rewards, train briefly on each, keep the best.

Each round the engine is asked for ``candidates_per_round`` reward functions (one Python code block
defining ``compute_reward(obs, action, next_obs, terminated, truncated) -> float``) from the env's
description and the previous rounds' results. Each candidate trains a short PPO run through
``polar run`` in its own process, on :data:`polar.llm_roles.sandboxed_reward.ENV_ID` (the candidate
itself runs in bubblewrap); its score is the task's own mean episode return over the last
``score_episodes`` training episodes, measured by the trusted wrapper. A reply without code, a
candidate that raises, hangs or tries to leave its sandbox is a failed candidate with its reason, and
the loop goes on. Rounds are bounded by ``rounds``.

With ``backend: ray`` the candidates of a round train as Ray tasks on the connected cluster (up to
``max_parallel`` at once), each running exactly the local path's ``polar run`` child, so the sandbox is
the same and a candidate's score does not depend on where it trained.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from polar.llm_roles.sandboxed_reward import ENV_ID

Ask = Callable[[list[dict[str, str]]], Awaitable[str]]
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(reply: str) -> str | None:
    """The first fenced code block of ``reply`` that defines ``compute_reward``, else the first block."""
    blocks = _BLOCK.findall(reply)
    for b in blocks:
        if "def compute_reward" in b:
            return str(b)
    return str(blocks[0]) if blocks else None


@dataclass
class Candidate:
    round: int
    index: int
    code: str | None
    score: float | None = None
    error: str | None = None
    episodes: int = 0
    # where and when it trained: backend, pid and node of the process that ran its `polar run`, start/end times
    worker: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.score is not None


@dataclass
class DesignResult:
    best: Candidate | None
    candidates: list[Candidate] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"best": asdict(self.best) if self.best else None, "candidates": [asdict(c) for c in self.candidates]}


@dataclass
class RewardDesignConfig:
    """What to design for and how much to spend: ``env_id`` (a Gymnasium id), its description for the
    engine, PPO steps per candidate, rounds, candidates per round, and how many train at once."""

    env_id: str
    description: str
    rounds: int = 2
    candidates_per_round: int = 3
    total_env_steps: int = 4096
    score_episodes: int = 20
    max_parallel: int = 1
    call_timeout_s: float = 5.0
    run_timeout_s: float = 600.0
    ppo_kwargs: dict[str, Any] = field(default_factory=lambda: {
        "n_steps": 64, "batch_size": 128, "n_epochs": 4, "learning_rate": 1e-3, "gamma": 0.99})
    envs: int = 4
    seed: int = 0
    # local: each candidate's `polar run` is a child of this process; ray: a Ray task on the connected cluster
    # (ray.init first: `polar design-reward` connects to `coordinator_address`) runs it, on any node
    backend: Literal["local", "ray"] = "local"
    ray_num_cpus: float = 1.0


SYSTEM = ("You write reward functions for reinforcement learning. Reply with exactly one Python code block "
          "defining compute_reward(obs, action, next_obs, terminated, truncated) -> float. Observations and "
          "actions are plain lists/numbers. Use only the standard library (math is fine). No I/O.")


def build_prompt(cfg: RewardDesignConfig, history: list[Candidate]) -> list[dict[str, str]]:
    """The engine's messages: the task, then every earlier candidate's score or error (the feedback)."""
    lines = [f"Environment {cfg.env_id}: {cfg.description}",
             "The score of a reward is the task's own mean episode return after a short PPO run; higher is better."]
    if history:
        lines.append("Results so far:")
        for c in history:
            verdict = f"score {c.score:.2f}" if c.score is not None else f"FAILED: {c.error}"
            lines.append(f"- round {c.round} candidate {c.index}: {verdict}\n```python\n{(c.code or '').strip()}\n```")
        lines.append("Write an improved reward function.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


def _run_config(cfg: RewardDesignConfig, cand_dir: Path, returns: Path, failure: Path, name: str) -> dict[str, Any]:
    return {
        "name": name, "seed": cfg.seed,
        "harness": {"type": "gymnasium", "id": f"polar.llm_roles.sandboxed_reward:{ENV_ID}",
                    "kwargs": {"base_id": cfg.env_id, "candidate_dir": str(cand_dir), "returns_path": str(returns),
                               "failure_path": str(failure), "call_timeout_s": cfg.call_timeout_s}},
        "agent": {"type": "mlp", "hidden_sizes": [64, 64]},
        "policy": {"type": "ppo", "kwargs": dict(cfg.ppo_kwargs)},
        "distribution": {"backend": "local", "rollout_workers": 0, "envs_per_worker": cfg.envs},
        "total_env_steps": cfg.total_env_steps,
        "eval": {"at_end": False},
    }


async def train_candidate(cfg: RewardDesignConfig, cand: Candidate, work: Path) -> None:
    """Train one candidate with ``polar run`` in a subprocess; fill in its score or its error."""
    if cand.code is None:
        return
    cand_dir = work / f"r{cand.round}c{cand.index}"
    cand_dir.mkdir(mode=0o755)
    (cand_dir / "candidate.py").write_text(cand.code)
    returns, failure = work / f"{cand_dir.name}.returns.jsonl", work / f"{cand_dir.name}.failure.txt"
    config = work / f"{cand_dir.name}.yaml"
    config.write_text(yaml.safe_dump(_run_config(cfg, cand_dir, returns, failure, cand_dir.name)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "ANTHROPIC", "POLAR_API"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polar.cli.main", "run", "--config", str(config), "--run-dir", str(work / f"{cand_dir.name}.run"),
        "--no-progress", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), cfg.run_timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        cand.error = f"the PPO run took longer than {cfg.run_timeout_s:.0f}s"
        return
    if failure.exists():
        cand.error = failure.read_text()[:500]
        return
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        cand.error = f"the PPO run exited {proc.returncode}: {tail[0][:300]}"
        return
    rows = [json.loads(x) for x in returns.read_text().splitlines()] if returns.exists() else []
    if not rows:
        cand.error = "the PPO run finished no episode"
        return
    last = rows[-cfg.score_episodes:]
    cand.episodes = len(rows)
    cand.score = sum(r["task_return"] for r in last) / len(last)


async def _train_here(cfg: RewardDesignConfig, cand: Candidate, work: Path) -> None:
    started = time.time()
    await train_candidate(cfg, cand, work)
    cand.worker = {"backend": "local", "pid": os.getpid(), "node": None, "started_at": started, "ended_at": time.time()}


def _train_in_ray_task(cfg: RewardDesignConfig, cand: Candidate, work: str) -> Candidate:
    """The body of the Ray task: the same ``train_candidate`` (a ``polar run`` child, the candidate in
    bubblewrap inside it) on whichever node Ray chose; the candidate comes back with its result. On a
    node without the work folder (no shared filesystem) it is created there, and the run stays there."""
    import ray

    started = time.time()
    Path(work).mkdir(parents=True, exist_ok=True)
    asyncio.run(train_candidate(cfg, cand, Path(work)))
    cand.worker = {"backend": "ray", "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                   "started_at": started, "ended_at": time.time()}
    return cand


async def _train_on_ray(cfg: RewardDesignConfig, cand: Candidate, work: Path) -> None:
    import ray

    if not ray.is_initialized():
        raise RuntimeError("backend: ray needs a connected Ray cluster (ray.init, or polar design-reward's "
                           "coordinator_address)")
    task = ray.remote(num_cpus=cfg.ray_num_cpus, max_retries=0)(_train_in_ray_task)
    try:
        done: Candidate = await task.remote(cfg, cand, str(work))
    except Exception as e:  # a lost node or worker: this candidate failed, the round goes on
        cand.error = f"its Ray task failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
        return
    cand.score, cand.error, cand.episodes, cand.worker = done.score, done.error, done.episodes, done.worker


async def design_reward(cfg: RewardDesignConfig, ask: Ask, workdir: Path | None = None,
                        on_candidate: Callable[[Candidate], None] | None = None) -> DesignResult:
    """Bounded Eureka loop: ``rounds`` x ``candidates_per_round`` candidates; returns the best by score."""
    work = Path(workdir or tempfile.mkdtemp(prefix="polar-reward-design-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o755)
    history: list[Candidate] = []
    gate = asyncio.Semaphore(max(1, cfg.max_parallel))

    train = _train_on_ray if cfg.backend == "ray" else _train_here

    async def one(c: Candidate) -> None:
        async with gate:
            if c.code is not None:
                await train(cfg, c, work)
        if on_candidate:
            on_candidate(c)

    for rnd in range(cfg.rounds):
        batch = []
        for i in range(cfg.candidates_per_round):
            reply = await ask(build_prompt(cfg, history))
            code = extract_code(reply)
            c = Candidate(rnd, i, code)
            if code is None:
                c.error = "the engine's reply has no ```python code block``` defining compute_reward"
            batch.append(c)
        await asyncio.gather(*(one(c) for c in batch))
        history.extend(batch)
    scored = [c for c in history if c.ok]
    best = max(scored, key=lambda c: c.score if c.score is not None else float("-inf")) if scored else None
    return DesignResult(best, history)
