"""Run a suite: one job per (harness, policy), each in a fresh process (local) or a Ray task, then the report.

A job builds its own env instances (or engine, gateway and session pipeline) and returns plain per-episode
records; the parent computes every metric and interval from them (``polar.evaluation.report``), so a job
that fails costs only its own row (``error``), never the report.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing as mp
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from polar.config.run import AgentRunConfig, AnyHarnessConfig, EnvRunConfig
from polar.errors import ConfigError, PolarError
from polar.evaluation.suite import AgentHarnessSpec, EnvHarnessSpec, EvalSuite, PolicySpec

if TYPE_CHECKING:
    from polar.evaluation.policies import ResolvedCheckpoint

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- held-out checks
def training_seeds(cfg: EnvRunConfig | AgentRunConfig) -> set[int]:
    """The env seeds a run's first start trains on: the learner's envs from ``seed``, rollout worker ``w``'s
    from ``seed + 7919 (w + 1)`` (``polar.rollout.backends.local``), one per env copy."""
    d = cfg.distribution
    bases = [cfg.seed] + [cfg.seed + 7919 * (w + 1) for w in range(d.rollout_workers)]
    return {b + i for b in bases for i in range(d.envs_per_runner)}


def check_held_out(harness: EnvHarnessSpec, run_cfg: EnvRunConfig | AgentRunConfig, policy: str) -> None:
    seeds = set(harness.seeds.seeds())
    clash = sorted(seeds & training_seeds(run_cfg))
    if clash:
        raise ConfigError(
            f"harness {harness.name!r}: seeds {clash[:3]} of seeds [{harness.seeds.start}, "
            f"{harness.seeds.start + harness.seeds.count}) were trained on by policy {policy!r} (run seed "
            f"{run_cfg.seed}); move seeds.start out of the training seeds, e.g. seeds.start: 1000000"
        )


# ---------------------------------------------------------------- env jobs
def _env_harness(suite: EvalSuite, h: EnvHarnessSpec, run_cfg: EnvRunConfig | AgentRunConfig
                 ) -> tuple[AnyHarnessConfig, Path]:
    """(harness config, directory its modules resolve in): inline, from ``config:``, or the run's own."""
    if h.harness is not None:
        return h.harness, suite.base_dir
    if h.config is not None:
        cfg = load_harness_config(suite, h)
        return cfg.harness, cfg.config_dir
    return run_cfg.harness, run_cfg.config_dir


def load_harness_config(suite: EvalSuite, h: EnvHarnessSpec | AgentHarnessSpec) -> EnvRunConfig | AgentRunConfig:
    """The run config a harness's ``config:`` names: a YAML file (modules resolve next to it) or a run directory
    (its config.resolved.yaml, modules where the run's config lived)."""
    from polar.config import load_config
    from polar.trainers.loading import load_run

    if h.config is None:
        raise ConfigError(f"harness {h.name!r} names no config: set 'config: FILE.yaml' or a run directory")
    path = suite.resolve(h.config)
    if path.is_dir():
        return load_run(path)[1]
    cfg = load_config(path)
    cfg._config_dir = path.resolve().parent
    return cfg


def env_job(suite: EvalSuite, h: EnvHarnessSpec, p: PolicySpec) -> list[dict[str, Any]]:
    from polar.evaluation.episodes import make_envs, run_env_episodes
    from polar.evaluation.policies import EnsemblePolicy, load_env_policy, resolve_checkpoint
    from polar.evaluation.wrappers import HeldOutSeeds, apply_wrappers
    from polar.harness import make_env
    from polar.rollout.episodes import PolicyActor

    members = [suite.policy(m) for m in p.ensemble] if p.ensemble else [p]
    resolved = [resolve_checkpoint(m, suite) for m in members]
    for m, r in zip(members, resolved, strict=True):
        check_held_out(h, r.cfg, m.name)
    harness_cfg, config_dir = _env_harness(suite, h, resolved[0].cfg)
    if harness_cfg.type == "agent":
        raise ConfigError(f"harness {h.name!r}: policy {p.name!r} comes from an agent run; evaluate it on a "
                          "'kind: agent' harness")
    torch.manual_seed(h.seeds.start)  # stochastic evaluation: the same suite samples the same actions
    np.random.seed(h.seeds.start % 2**32)
    seeds = h.seeds.seeds()

    def make_one() -> gym.Env[Any, Any]:
        return HeldOutSeeds(apply_wrappers(make_env(harness_cfg, config_dir), h.wrappers), h.seeds.start, h.seeds.count)

    envs = make_envs(make_one, min(h.num_envs, len(seeds)))
    try:
        raw = envs[0].unwrapped
        obs_space, act_space = raw.observation_space, raw.action_space
        if envs[0].observation_space.shape != obs_space.shape:
            raise ConfigError(
                f"harness {h.name!r}: its wrappers change observations from {obs_space.shape} to "
                f"{envs[0].observation_space.shape}; policy {p.name!r} takes {obs_space.shape} (distractor_features "
                "needs a policy trained with them)")
        policies = []
        for m, r in zip(members, resolved, strict=True):
            try:
                policies.append(load_env_policy(r, obs_space, act_space))
            except RuntimeError as e:  # state dict of another shape: a policy from another game
                raise ConfigError(f"policy {m.name!r} ({r.checkpoint}) does not fit harness {h.name!r} "
                                  f"(observations {obs_space}, actions {act_space}): {str(e).splitlines()[0]}") from None
        actor = EnsemblePolicy(policies, [m.name for m in members]) if p.ensemble else PolicyActor(policies[0])
        keys = tuple(m.info_key for m in h.metrics if m.info_key)
        return run_env_episodes(actor, envs, seeds, h.deterministic, h.max_episode_steps, keys)
    finally:
        for env in envs:
            env.close()


# ---------------------------------------------------------------- agent jobs
def _agent_config(suite: EvalSuite, h: AgentHarnessSpec, resolved: list[ResolvedCheckpoint]) -> AgentRunConfig:
    if h.config is not None:
        cfg = load_harness_config(suite, h)
    else:
        cfg = resolved[0].cfg
    if not isinstance(cfg, AgentRunConfig) or cfg.harness.type != "agent":
        raise ConfigError(f"harness {h.name!r} is kind: agent but its config has harness.type {cfg.harness.type!r}")
    return cfg


def agent_tasks(suite: EvalSuite, h: AgentHarnessSpec, cfg: AgentRunConfig) -> list[dict[str, Any]]:
    """The harness's held-out tasks (refusing the run's training task file)."""
    from polar.harness.agent.tasks import load_tasks, resolve

    if h.tasks is not None:
        path = suite.resolve(h.tasks)
    elif isinstance(cfg.eval_tasks, str):
        path = Path(resolve(cfg.eval_tasks, cfg.config_dir))
    elif cfg.eval_tasks is not None:
        raise ConfigError(f"harness {h.name!r}: its config's eval_tasks is a generated task source "
                          f"({type(cfg.eval_tasks).__name__}), not a file; set 'tasks: FILE.jsonl' (held-out tasks) "
                          "on the harness")
    else:
        raise ConfigError(f"harness {h.name!r}: no tasks: set 'tasks: FILE.jsonl' (held-out tasks) or eval_tasks "
                          "in its config")
    if isinstance(cfg.tasks, str) and Path(resolve(cfg.tasks, cfg.config_dir)).resolve() == path.resolve():
        raise ConfigError(f"harness {h.name!r}: tasks {path} is the training task file of its config, not held "
                          "out; give held-out tasks (e.g. the config's eval_tasks)")
    tasks = load_tasks(str(path), suite.base_dir)
    return tasks[: h.max_tasks] if h.max_tasks else tasks


def agent_job(suite: EvalSuite, h: AgentHarnessSpec, p: PolicySpec, out_dir: Path) -> list[dict[str, Any]]:
    import asyncio

    from polar.evaluation.agents import (
        EnsembleEngine,
        GreedyEngine,
        _embedded_engine,
        _load_weights,
        run_agent_sessions,
    )
    from polar.evaluation.policies import resolve_checkpoint

    members = [suite.policy(m) for m in p.ensemble] if p.ensemble else [p]
    resolved = [resolve_checkpoint(m, suite) for m in members] if p.model is None else []
    cfg = _agent_config(suite, h, resolved)
    tasks = agent_tasks(suite, h, cfg)
    engines: list[Any] = []  # Engine, or the proxies of polar.evaluation.agents (duck-typed engines)
    try:
        if isinstance(p.model, dict):  # a model section: a chat endpoint (engine: openai_compat) or a local model
            from polar.trainers.agentic_run import engine_of_model_section

            engines.append(engine_of_model_section(p.model, f"policies[{p.name}].model"))
        elif p.model is not None:
            engines.append(_embedded_engine(p.model, cfg))
        else:
            for r in resolved:
                if not isinstance(r.cfg, AgentRunConfig):
                    raise ConfigError(f"policy {p.name!r} comes from an env run ({r.run_dir.path}); evaluate it on "
                                      "a 'kind: env' harness")
                spec = r.cfg.model.name_or_path if r.cfg.model else r.cfg.gateway.model
                member = _embedded_engine(spec, r.cfg)
                engines.append(member)
                _load_weights(member, r.cfg, r.checkpoint)
        engine: Any = EnsembleEngine(engines) if len(engines) > 1 else engines[0]
        if h.deterministic and getattr(engine, "text_level", False):  # a chat endpoint: ask it for greedy
            engine.temperature_override = 0.0
        elif h.deterministic:
            engine = GreedyEngine(engine)
        else:
            torch.manual_seed(h.seed)
        safe = f"{h.name}--{p.name}".replace("/", "_")
        return run_agent_sessions(cfg, engine, tasks, h.samples_per_task, out_dir / "work" / safe,
                                  out_dir / "sessions" / safe, tag=f"suite:{suite.name}:{safe}")
    finally:
        for e in engines:
            asyncio.run(e.close())


# ---------------------------------------------------------------- one job, in its own process
def run_job(suite_data: dict[str, Any], base_dir: str, harness: str, policy: str, out_dir: str) -> dict[str, Any]:
    """Runs in a fresh process: plain data in, plain data out (no objects cross the process boundary)."""
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    suite = EvalSuite.model_validate(suite_data)
    suite._base_dir = Path(base_dir)
    h = next(x for x in suite.harnesses if x.name == harness)
    p = suite.policy(policy)
    t0 = time.monotonic()
    res: dict[str, Any] = {"harness": harness, "policy": policy, "error": None, "episodes": []}
    try:
        res["episodes"] = env_job(suite, h, p) if h.kind == "env" else agent_job(suite, h, p, Path(out_dir))
    except PolarError as e:
        res["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    except Exception as e:  # a bug or a broken env: one line in the report, the traceback in the log
        log.error("job %s / %s failed:\n%s", harness, policy, traceback.format_exc())
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    res["time_s"] = round(time.monotonic() - t0, 3)
    return res


def jobs_of(suite: EvalSuite) -> list[tuple[str, str]]:
    return [(h.name, p.name) for h in suite.harnesses for p in suite.policies_for(h)]


def _run_local(suite: EvalSuite, out_dir: Path, jobs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    data = suite.model_dump(mode="json")
    ctx = mp.get_context("spawn")  # fresh interpreters: no state (threads, seeds, env registries) inherited
    results: dict[tuple[str, str], dict[str, Any]] = {}
    # a job builds its own envs / connectors / engine and gateway; the interpreters (torch imported) are reused
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=min(suite.parallel.workers, len(jobs)), mp_context=ctx)
    try:
        futs = {pool.submit(run_job, data, str(suite.base_dir), h, p, str(out_dir)): (h, p) for h, p in jobs}
        deadline = time.monotonic() + suite.parallel.job_timeout_s * max(1, -(-len(jobs) // suite.parallel.workers))
        try:
            for fut in concurrent.futures.as_completed(futs, timeout=max(1.0, deadline - time.monotonic())):
                h, p = futs[fut]
                try:
                    results[(h, p)] = fut.result()
                except Exception as e:  # the process died (OOM kill, segfault)
                    results[(h, p)] = {"harness": h, "policy": p, "episodes": [], "time_s": None,
                                       "error": f"the job's process died ({type(e).__name__}: {e})"}
        except concurrent.futures.TimeoutError:
            for (h, p) in jobs:
                results.setdefault((h, p), {"harness": h, "policy": p, "episodes": [], "time_s": None,
                                            "error": f"timed out: the suite did not finish within parallel.job_timeout_s "
                                                     f"= {suite.parallel.job_timeout_s:g} s per round of "
                                                     "parallel.workers jobs"})
            for proc in list(getattr(pool, "_processes", {}).values()):  # hung jobs must not outlive the suite
                proc.kill()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [results[j] for j in jobs]


def _run_ray(suite: EvalSuite, out_dir: Path, jobs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise ConfigError("parallel.backend is 'ray' but ray is not installed; pip install 'polar-rl[ray]' or set "
                          "parallel.backend: local") from None
    started = False
    if not ray.is_initialized():
        ray.init(address=suite.parallel.address, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_calls=1)(run_job)  # max_calls=1: a fresh worker process per job
        data = suite.model_dump(mode="json")
        refs = [remote.remote(data, str(suite.base_dir), h, p, str(out_dir)) for h, p in jobs]
        out = []
        for (h, p), ref in zip(jobs, refs, strict=True):
            try:
                out.append(ray.get(ref, timeout=suite.parallel.job_timeout_s))
            except Exception as e:
                ray.cancel(ref, force=True)
                out.append({"harness": h, "policy": p, "episodes": [], "time_s": None,
                            "error": f"ray task failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"})
        return out
    finally:
        if started:
            ray.shutdown()


def check_trust(suite: EvalSuite, trust_code: bool) -> None:
    """Refuse a suite that reopens a run folder whose config names code (a custom agent, env, connector,
    harness or verifier) unless ``trust_code``: the suite file is the user's own, the runs it names are data.
    Runs before any job starts, so nothing a run names is imported."""
    from polar.config.trust import require_trust
    from polar.trainers.loading import load_run, resolve_target

    if trust_code:
        return
    for p in suite.policies:
        where = p.checkpoint if p.checkpoint is not None else p.run
        if where is None:
            continue
        path = suite.resolve(where)
        if path.exists():  # a missing one is reported by its job
            run_dir, cfg, _ = resolve_target(path)
            require_trust(cfg, f"policy {p.name!r}: run {run_dir.path}", trust_code)
    for h in suite.harnesses:
        if h.config is None:
            continue
        path = suite.resolve(h.config)
        run_path = path if path.is_dir() else path.parent if (path.parent / "run.json").is_file() else None
        if run_path is not None:  # a run folder, or a config file inside one: data, not the user's own YAML
            run_dir, cfg = load_run(run_path)
            require_trust(cfg, f"harness {h.name!r}: run {run_dir.path}", trust_code)


def run_suite(suite: EvalSuite, out_dir: str | Path | None = None, trust_code: bool = False) -> dict[str, Any]:
    """Run every job and write report.json / report.md / report.html into ``out_dir``; returns the report.
    ``trust_code``: the run folders it names may name code that evaluating them imports (``check_trust``)."""
    from polar.evaluation.report import build_report, write_report

    check_trust(suite, trust_code)

    out = Path(out_dir) if out_dir else (suite.resolve(suite.out_dir) if suite.out_dir else
                                         Path("eval-reports") / f"{suite.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    jobs = jobs_of(suite)
    t0 = time.monotonic()
    results = (_run_ray if suite.parallel.backend == "ray" else _run_local)(suite, out, jobs)
    report = build_report(suite, results, time.monotonic() - t0)
    report["out_dir"] = str(out)
    write_report(report, out)
    return report
