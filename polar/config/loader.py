"""YAML → typed RunConfig: strict keys, ``-o key.path=value`` overrides, resolved dump."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from polar.config.base import validate
from polar.errors import ConfigError


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``3e-4`` as a float (YAML 1.1 wants ``3.0e-4``; people write ``3e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str, source: str = "config") -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{source}: malformed YAML{where}: {problem}") from None


def read_yaml_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}. Pass an existing YAML file to --config.")
    data = parse_yaml(p.read_text(), source=str(p))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections (name, harness, ...), got {type(data).__name__}.")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str] | None, source: str = "-o") -> dict[str, Any]:
    """Apply ``key.path=value`` overrides; values are parsed as YAML (``3e-4``, ``[1,2]``, ``true``)."""
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"{source} {item!r}: expected key.path=value, e.g. -o policy.kwargs.learning_rate=1e-3")
        key, _, raw = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"{source} {item!r}: empty key path")
        value = parse_yaml(raw, source=f"{source} {key}") if raw.strip() else ""
        node = data
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"{source} {item!r}: '{part}' is a value, not a section")
            node = nxt
        node[parts[-1]] = value
    return data


def load_config(path: str | Path, overrides: list[str] | None = None):
    """Load, override and strictly validate a run config. Module paths resolve next to the file."""
    from polar.config.run import RunConfig

    p = Path(path).resolve()
    data = apply_overrides(read_yaml_file(p), overrides)
    cfg = validate(RunConfig, data, source=str(path))
    cfg._config_dir = p.parent
    return cfg


def dump_config(cfg) -> str:
    """The resolved config as YAML (what ``config.resolved.yaml`` holds)."""
    return yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=False), sort_keys=False)
