"""Secrets in configs: declared on their fields, redacted from everything written or served, re-supplied from
the environment (or a file) when a run is reopened.

A secret field is declared with ``secret_field(env=...)``: its value may come from the config, or from the
environment variable ``env`` (or the file named by ``env + "_FILE"``) when the config leaves it unset. Free-form
mappings (``env:``, ``kwargs:``) are redacted by key name (``*_TOKEN``, ``*_API_KEY``, ``password``, ...). A
redacted value reads back as ``REDACTED``; loading a config that holds it takes the value from the environment
again, or stops with one line naming the key and the variable to set.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from polar.errors import ConfigError

REDACTED = "<redacted>"
SECRET_MARK = "polar_secret_env"
# a key that names a credential: token, secret, password, api key, access/private key, credentials (not max_tokens)
SECRET_KEY = re.compile(r"(?:^|[_\-.])(?:token|secret|password|passwd|api[_\-]?key|access[_\-]?key|private[_\-]?key"
                        r"|credentials?|auth)$", re.IGNORECASE)


def secret_field(env: str, description: str) -> Any:
    """A ``str | None`` config field that holds a credential: redacted on disk, re-supplied from ``$env`` (or
    the file ``$env_FILE`` names)."""
    return Field(None, description=f"{description} (a secret: set it with ${env} or ${env}_FILE, not on a command "
                                   "line; redacted in config.resolved.yaml)", json_schema_extra={SECRET_MARK: env})


UNREADABLE_SECRET_FILE = "{what} names {path}, which cannot be read ({cause}); point it at a file holding the secret"
EMPTY_SECRET_FILE = "{what} names {path}, which is empty; write the secret into it"


def read_secret_file(path: str, what: str, unreadable: str = UNREADABLE_SECRET_FILE,
                     empty: str = EMPTY_SECRET_FILE) -> str:
    """The stripped contents of a secret file named by ``what`` (a flag or a variable); a one-line
    ``ConfigError`` when it is missing or empty, from ``unreadable``/``empty`` (formatted with ``what``,
    ``path`` and, when unreadable, ``cause``), so a command keeps its own wording."""
    try:
        text = Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(unreadable.format(what=what, path=path, cause=e.strerror or e)) from None
    if not text:
        raise ConfigError(empty.format(what=what, path=path))
    return text


def from_env(env: str) -> str | None:
    """The value of ``$env``, else the stripped contents of the file ``$env_FILE`` names, else None."""
    value = os.environ.get(env)
    if value:
        return value
    path = os.environ.get(env + "_FILE")
    return read_secret_file(path, f"${env}_FILE") if path else None


# a tokenizer's special tokens ({eos_token: "</s>"}) are text, not credentials
NOT_SECRET = re.compile(r"(?:^|[_\-.])(?:bos|eos|pad|unk|sep|cls|mask|stop|start|end|special|chat|image|tool)"
                        r"[_\-]?token$", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(key)) and not NOT_SECRET.search(key)


def _secret_env(model: type[BaseModel], name: str) -> str | None:
    extra = model.model_fields[name].json_schema_extra
    return str(extra[SECRET_MARK]) if isinstance(extra, dict) and SECRET_MARK in extra else None


def redact(model: BaseModel) -> dict[str, Any]:
    """``model.model_dump(mode="json")`` with every declared secret and every secret-named mapping entry
    replaced by ``REDACTED`` (unset secrets stay null)."""
    data = model.model_dump(mode="json", exclude_none=False)
    _redact_model(model, data)
    return data


def _redact_model(model: BaseModel, data: dict[str, Any]) -> None:
    for name in type(model).model_fields:
        key = name
        if key not in data:
            continue
        value = getattr(model, name)
        if _secret_env(type(model), name) is not None:
            if data[key] is not None:
                data[key] = REDACTED
        elif isinstance(value, BaseModel) and isinstance(data[key], dict):
            _redact_model(value, data[key])
        elif isinstance(value, list) and isinstance(data[key], list):
            for v, d in zip(value, data[key], strict=False):
                if isinstance(v, BaseModel) and isinstance(d, dict):
                    _redact_model(v, d)
                else:
                    _redact_free(d)
        else:
            _redact_free(data[key])


def _redact_free(data: Any) -> None:
    """Free-form data (``env:``, ``kwargs:``): entries whose key names a credential."""
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(k, str) and is_secret_key(k) and isinstance(v, str) and v:
                data[k] = REDACTED
            else:
                _redact_free(v)
    elif isinstance(data, list):
        for v in data:
            _redact_free(v)


def redact_override(override: str) -> str:
    """A ``KEY.PATH=VALUE`` override as it may be logged: the value replaced by ``REDACTED`` when the last key
    names a credential (``harness.connector_spec.token=...``, ``...env.HF_TOKEN=...``)."""
    key, sep, _ = override.partition("=")
    return f"{key}={REDACTED}" if sep and is_secret_key(key.rsplit(".", 1)[-1].strip()) else override


def redact_yaml_text(text: str) -> str:
    """A YAML or JSON document with secret-named entries redacted (for files served as they are on disk, e.g.
    an old run's config.resolved.yaml); text that does not parse comes back unchanged but for whole lines
    ``key: value`` whose key names a credential."""
    import json

    import yaml

    if text.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, (dict, list)):
            _redact_free(data)
            return json.dumps(data, indent=2)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, (dict, list)):
        _redact_free(data)
        return str(yaml.safe_dump(data, sort_keys=False))
    return re.sub(r"(?m)^(\s*[\"']?([\w\-.]+)[\"']?\s*:\s*)(\S.*)$",
                  lambda m: m.group(1) + REDACTED if is_secret_key(m.group(2)) else m.group(0), text)


def resupply(model: BaseModel, source: str, path: tuple[str, ...] = ()) -> None:
    """Fill declared secrets left unset from their environment variable (or file), and replace every
    ``REDACTED`` value by the real one from the environment; a redacted secret with nothing to take it from is
    a ``ConfigError`` naming the key and the variable."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        where = (*path, name)
        env = _secret_env(type(model), name)
        if env is not None:
            if value is None or value == REDACTED:
                got = from_env(env)
                if got is None and value == REDACTED:
                    raise ConfigError(f"{source}: {'.'.join(where)} was redacted when the run was written; set ${env} "
                                      f"(or ${env}_FILE) to the secret to reopen it")
                if got is not None:
                    object.__setattr__(model, name, got)
        elif isinstance(value, BaseModel):
            resupply(value, source, where)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, BaseModel):
                    resupply(v, source, (*where, str(i)))
                else:
                    _resupply_free(v, source, (*where, str(i)))
        else:
            _resupply_free(value, source, where)


def _resupply_free(data: Any, source: str, where: tuple[str, ...]) -> None:
    if isinstance(data, dict):
        for k, v in data.items():
            if v == REDACTED and isinstance(k, str):
                got = from_env(k.upper()) if not os.environ.get(k) else os.environ[k]
                if got is None:
                    raise ConfigError(f"{source}: {'.'.join((*where, k))} was redacted when the run was written; set "
                                      f"${k.upper()} (or ${k.upper()}_FILE) to the secret to reopen it")
                data[k] = got
            else:
                _resupply_free(v, source, (*where, str(k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            _resupply_free(v, source, (*where, str(i)))
