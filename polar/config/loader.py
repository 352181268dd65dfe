"""YAML → typed RunConfig: strict keys, ``-o key.path=value`` overrides, resolved dump."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from polar.config.base import format_validation_error, validate
from polar.config.secrets import redact, resupply
from polar.errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from polar.config.run import AgentRunConfig, EnvRunConfig


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
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
    if p.is_dir():
        found = sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml"))
        hint = f"one of its YAML files, e.g. --config {found[0]}" if found else "a YAML file"
        raise ConfigError(f"{p} is a directory, not a config file. Pass {hint}.")
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


def _number_texts(overrides: list[str] | None) -> dict[tuple[str, ...], str]:
    """Key path -> the text of each override whose value YAML reads as a number (``env.PORT=400``, ``tag=007``)."""
    out = {}
    for item in overrides or []:
        key, _, raw = item.partition("=")
        parts = tuple(p for p in key.strip().split(".") if p)
        try:
            value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""
        except yaml.YAMLError:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[parts] = raw.strip()
    return out


def validate_with_overrides(model: Any, data: dict[str, Any], overrides: list[str] | None, source: str) -> Any:
    """``validate``, where an override that YAML read as a number lands on a field the schema says is a
    string: that field gets the text as typed (``-o harness.connector_spec.env.PORT=400`` is ``"400"``,
    and ``007`` stays ``"007"``), as a YAML file would with quotes."""
    from pydantic import BaseModel, ValidationError

    from polar.config.base import _adapter, _display_loc

    texts = _number_texts(overrides)
    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model.model_validate(data)
        return _adapter(model).validate_python(data)
    except ValidationError as err:
        fixed = False
        for e in err.errors():
            path = tuple(str(part) for part in _display_loc(model, tuple(e["loc"])))
            if e["type"] == "string_type" and path in texts:
                node = data
                for part in path[:-1]:
                    node = node[part]
                node[path[-1]] = texts[path]
                fixed = True
        if not fixed:
            raise ConfigError(format_validation_error(err, model, source)) from None
    return validate(model, data, source=source)


def load_config(path: str | Path, overrides: list[str] | None = None) -> EnvRunConfig | AgentRunConfig:
    """Load, override and strictly validate a run config. Module paths resolve next to the file."""
    from polar.config.run import RunConfig

    p = Path(path).resolve()
    data = apply_overrides(read_yaml_file(p), overrides)
    cfg: EnvRunConfig | AgentRunConfig = validate_with_overrides(RunConfig, data, overrides, source=str(path))
    resupply(cfg, source=str(path))  # secrets from the environment; a redacted one must be given again
    cfg._config_dir = p.parent
    return cfg


def dump_config(cfg: BaseModel) -> str:
    """The resolved config as YAML (what ``config.resolved.yaml`` holds), every secret redacted: a run folder is
    shared, served by the dashboard and copied around; secrets come back from the environment on resume."""
    return str(yaml.safe_dump(redact(cfg), sort_keys=False))
