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

from polar.errors import ConfigError, ConnectorStartError


def check_before_start(cfg: Any) -> None:
    """Raise the first problem with ``cfg``'s harness, agent or tasks that can be found without starting them."""
    config_dir = Path(cfg.config_dir) if cfg.config_dir else Path.cwd()
    h = cfg.harness
    if h.type == "gymnasium":
        from polar.harness.gymnasium_adapter import check_id

        check_id(h.id)
    elif h.type == "custom":
        _check_connector(h.connector_spec, config_dir)
    elif h.type == "agent":
        _check_agent_harness(cfg, config_dir)
    if getattr(cfg, "kind", None) == "agent":  # distribution keys an agent run cannot honour
        from polar.trainers.build import check_agent_distribution

        check_agent_distribution(cfg)
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


def _check_agent_harness(cfg: Any, config_dir: Path) -> None:
    h = cfg.harness
    if h.command and "{" not in h.command[0]:
        program = h.command[0]
        path = {**os.environ, **h.env}.get("PATH")
        if shutil.which(program, path=path) is None and not (config_dir / program).exists():
            raise ConfigError(f"harness.command: executable {program!r} not found on PATH or in {config_dir}; "
                              "install it or fix the command")
    if h.callable:
        from polar.harness.agent.runners import import_callable

        import_callable(h.callable, cfg.config_dir)
    from polar.harness.sessions import load_run_tasks as load_tasks

    # policy sft (without sft_warmup) reads `tasks` as its demonstrations (chat JSONL), not as prompts
    demos = cfg.policy.type == "sft" and cfg.sft_warmup is None
    for path in ((cfg.eval_tasks,) if demos else (cfg.tasks, cfg.eval_tasks)):
        if path:
            load_tasks(path, cfg.config_dir)
