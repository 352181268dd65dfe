"""Build the agent a config asks for: a built-in actor-critic, or a user's ``AgentBase`` subclass loaded
from ``module`` + ``class_name`` (resolved next to the config file first, then the working directory)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import gymnasium as gym

from polar.agents import AgentBase
from polar.config.base import did_you_mean
from polar.errors import ConfigError

if TYPE_CHECKING:
    from polar.config.run import NetworkAgentConfig


def import_user_module(module: str, config_dir: Path | None, what: str = "agent.module") -> ModuleType:
    """Import ``module`` from ``config_dir`` (as a file path), else the cwd, else sys.path."""
    rel = Path(*module.split(".")).with_suffix(".py")
    for base in [config_dir, Path.cwd()]:
        if base is None:
            continue
        path = (Path(base) / rel).resolve()
        if path.is_file():
            name = f"polar_user.{path.parent.name}.{module}"
            if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
                return sys.modules[name]
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:  # a .py path always has a source loader; kept for the type
                raise ConfigError(f"{what}: {path} cannot be imported as a Python module")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            if str(path.parent) not in sys.path:
                sys.path.insert(0, str(path.parent))  # let the user's module import its neighbours
            try:
                spec.loader.exec_module(mod)
            except Exception as e:
                sys.modules.pop(name, None)
                raise ConfigError(f"{what}: importing {path} failed: {type(e).__name__}: {e}") from e
            return mod
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            where = ", ".join(str(p) for p in [config_dir, Path.cwd()] if p is not None)
            raise ConfigError(f"{what}: module {module!r} not found (looked for {rel} in {where}, then sys.path).") from None
        raise


def load_agent_class(module: str, class_name: str, config_dir: Path | None) -> type[AgentBase]:
    mod = import_user_module(module, config_dir)
    cls = getattr(mod, class_name, None)
    if cls is None:
        names = [n for n, v in vars(mod).items() if inspect.isclass(v)]
        raise ConfigError(f"agent.class_name: {class_name!r} not found in module {module!r}{did_you_mean(class_name, names)}.")
    if not (inspect.isclass(cls) and issubclass(cls, AgentBase)):
        raise ConfigError(f"agent.class_name: {module}.{class_name} must subclass polar.AgentBase (from polar import AgentBase).")
    return cls


def build_agent(agent_cfg: NetworkAgentConfig, observation_space: gym.Space, action_space: gym.Space, config_dir: Path | None = None) -> AgentBase:
    """Instantiate the configured agent and bind the env's spaces to it."""
    if agent_cfg.type == "custom":
        cls = load_agent_class(agent_cfg.module, agent_cfg.class_name, config_dir)
        try:
            agent = cls(**agent_cfg.kwargs)
        except TypeError as e:
            sig = inspect.signature(cls.__init__)
            raise ConfigError(f"agent.kwargs: {cls.__name__}{sig} rejected {agent_cfg.kwargs}: {e}") from None
        agent.bind_spaces(observation_space, action_space)
        return agent
    from polar.models.actor_critic import ActorCriticAgent

    if agent_cfg.type == "cnn":
        from polar.models.encoders import is_image_space

        subs = observation_space.spaces.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
        if not any(is_image_space(s) for s in subs):
            raise ConfigError(f"agent.type: 'cnn' needs a uint8 HxWxC image observation; got {observation_space}. Use 'mlp'.")
    return ActorCriticAgent(observation_space, action_space, agent_cfg)
