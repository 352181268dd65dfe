"""Checks that need no process, run before ``polar run`` creates anything.

An unknown Gymnasium id, a connector program that is not installed or a module that does not exist would
otherwise be found while the run starts, after its run directory exists. Each check raises the same
one-line ``PolarError`` the component raises itself; checks that would need the env or the model
(spaces, weights) stay where they are.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

from polar.config.harness import AgentHarnessConfig
from polar.config.run import AgentRunConfig, RunConfig
from polar.errors import ConfigError, ConnectorStartError


def check_before_start(cfg: RunConfig) -> None:
    """Raise the first problem with ``cfg``'s harness, agent or tasks that can be found without starting them."""
    config_dir = Path(cfg.config_dir) if cfg.config_dir else Path.cwd()
    h = cfg.harness
    if h.type == "gymnasium":
        from polar.harness.gymnasium_adapter import check_id, check_wrappers

        check_id(h.id)
        check_wrappers(h.wrappers)
    elif h.type == "envpool":
        from polar.harness.envpool_adapter import check_id as check_envpool_id

        check_envpool_id(h.id, h.kwargs)
    elif h.type == "custom":
        _check_connector(h.connector_spec, config_dir)
    elif isinstance(h, AgentHarnessConfig) and isinstance(cfg, AgentRunConfig):
        _check_agent_harness(cfg, h, config_dir)
    if isinstance(cfg, AgentRunConfig):  # distribution keys an agent run cannot honour; the verifier
        check_agent_distribution(cfg)
        if cfg.verifier is not None:
            _check_verifier(cfg.verifier.type, config_dir, dict(cfg.verifier.kwargs))
    agent = getattr(cfg, "agent", None)
    if agent is not None and agent.type == "custom":
        from polar.models.loader import load_agent_class

        load_agent_class(agent.module, agent.class_name, cfg.config_dir)


def _check_connector(spec: Any, config_dir: Path) -> None:
    if spec.command:
        from polar.harness.connector.process import check_command

        check_command(spec, config_dir)
        return
    if spec.python is not None or "PYTHONPATH" in spec.env:
        return  # another interpreter or search path: only the connector process can tell
    from polar.harness.connector.server import module_name, module_not_found

    module = module_name(spec.module)
    top = module.split(".")[0]
    where = list(dict.fromkeys([str(config_dir), os.getcwd()]))  # the connector host searches these first
    if importlib.machinery.PathFinder.find_spec(top, where) is None and importlib.util.find_spec(top) is None:
        raise ConnectorStartError(module_not_found(module, where))  # as the connector process would say it


def _check_agent_harness(cfg: AgentRunConfig, h: AgentHarnessConfig, config_dir: Path) -> None:
    if h.command and "{" not in h.command[0]:
        program = h.command[0]
        path = {**os.environ, **h.env}.get("PATH")
        if shutil.which(program, path=path) is None and not (config_dir / program).exists():
            raise ConfigError(f"harness.command: executable {program!r} not found on PATH or in {config_dir}; "
                              "install it or fix the command")
    if h.callable:
        check_callable("harness.callable", h.callable, config_dir)
    from polar.config.grpo import SFTKwargs
    from polar.config.llm_agent import TaskSource
    from polar.harness.sessions import load_run_tasks as load_tasks

    # policy sft (without sft_warmup) reads `tasks` as its demonstrations (chat JSONL), not as prompts
    demos = isinstance(cfg.policy.kwargs, SFTKwargs) and cfg.sft_warmup is None
    sources: list[str | TaskSource | None] = [cfg.eval_tasks] if demos else [cfg.tasks, cfg.eval_tasks]
    for source in sources:
        if source:
            load_tasks(source, cfg.config_dir)


def check_agent_distribution(cfg: AgentRunConfig, engine: Any = None) -> None:
    """Refuse, in one line naming the key, a ``distribution`` an agent run cannot honour: with ``backend:
    local`` everything but ``num_gpus``; with ``ray`` what is not the learner actor (``learner_resources``,
    ``max_learner_restarts``), the gateway nodes (``rollout_workers``, ``gateway_resources``), the cluster
    (``coordinator_address``, ``connect_timeout_s``) or ``num_gpus``; on Ray also an engine the nodes cannot
    each build, and an engine object handed in (it cannot travel to the learner actor)."""
    from polar.rollout.sessions.ray_nodes import agent_distribution_problems

    d = cfg.distribution
    problems = agent_distribution_problems(d, learner_actor=d.backend == "ray")
    if d.backend == "ray":
        from polar.trainers.agentic_run import ray_engine_problem

        problems += [p for p in [ray_engine_problem(cfg)] if p]
        if engine is not None:
            problems.append("distribution.backend is 'ray': the learner and the gateway nodes build their engines "
                            "from the config in their actors, so an engine object cannot be passed in; drop it, or "
                            "set distribution.backend: local")
    if problems:
        raise ConfigError(problems[0] + (f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})"
                                         if len(problems) > 1 else ""))


# the verifiers that live in polar (polar.harness.agent.verifiers): names, not modules next to the config
_NAMED_VERIFIERS = ("env_return", "humaneval", "reasoning_gym", "lm_eval")


def _check_verifier(kind: str, config_dir: Path, kwargs: dict[str, Any]) -> None:
    if ":" in kind and kind not in _NAMED_VERIFIERS:
        check_callable("verifier.type", kind, config_dir)
        from polar.harness.agent.runners import import_callable
        from polar.harness.agent.verifiers import check_verifier_signature

        check_verifier_signature(import_callable(kind, config_dir), kind, kwargs)


def _local_modules(where: list[Path]) -> list[str]:
    """Module names importable from ``where``: ``*.py`` files and packages (what a typo is compared with)."""
    names: set[str] = set()
    for d in where:
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.py"))
            names.update(p.parent.name for p in d.glob("*/__init__.py"))
    return sorted(names)


def check_callable(key: str, spec: str, config_dir: Path) -> None:
    """Import ``spec`` (``module:function``, the module next to the config or on PYTHONPATH) as the run will;
    a module that is not there names ``key`` and the close match among the modules next to the config."""
    from polar.config.base import did_you_mean
    from polar.harness.agent.runners import import_callable

    module = spec.partition(":")[0]
    top = module.split(".")[0]
    where = list(dict.fromkeys([config_dir, Path.cwd()]))
    if top and importlib.machinery.PathFinder.find_spec(top, [str(d) for d in where]) is None \
            and importlib.util.find_spec(top) is None:
        raise ConfigError(f"{key} {spec!r}: no module {top!r} next to the config ({config_dir}) or on PYTHONPATH"
                          f"{did_you_mean(top, _local_modules(where))}; fix the name, or put the module there")
    try:
        import_callable(spec, config_dir)
    except ConfigError as e:
        raise ConfigError(f"{key} {spec!r}: {e}") from None
