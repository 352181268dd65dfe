"""Which parts of a run config name code: a run folder is data, the modules and programs it names are not.

``polar eval`` / ``export`` / ``serve`` open run folders that may come from someone else. Reopening one must not
import a module or start a program it names unless the user says they trust it (``--trust-code``, as
transformers' ``trust_remote_code``). ``code_references`` lists what would run; ``require_trust`` refuses with
the first of them named.
"""

from __future__ import annotations

from pydantic import BaseModel

from polar.errors import ConfigError

# (section class name, field) -> "always": the value is code (a module, a program); "colon": only a
# 'module:name' value is code (built-in names are not); "module": code unless a 'pettingzoo.' module
CODE_FIELDS: dict[tuple[str, str], str] = {
    ("CustomAgentConfig", "module"): "always",
    ("GymnasiumHarnessConfig", "id"): "colon",  # 'my_pkg.envs:MyEnv-v0' imports my_pkg.envs
    ("GymnasiumHarnessConfig", "wrappers"): "always",  # 'minigrid.wrappers:ImgObsWrapper' imports minigrid.wrappers
    ("ConnectorSpec", "module"): "always",
    ("ConnectorSpec", "command"): "always",
    ("ConnectorSpec", "python"): "always",
    ("AgentHarnessConfig", "command"): "always",
    ("AgentHarnessConfig", "callable"): "always",
    ("VerifierConfig", "type"): "colon",
    ("RewardShapingConfig", "function"): "always",
    ("LLMAgentConfig", "translator"): "colon",
    ("LLMAgentConfig", "image_to_text"): "always",
    ("OldTaskConfig", "id"): "colon",
    ("PettingZooHarnessConfig", "id"): "module",  # imported: code unless one of PettingZoo's own env modules
}


def _is_code(kind: str, value: object) -> bool:
    if value is None or value == [] or value == "":
        return False
    if kind == "module":
        return not (isinstance(value, str) and value.startswith("pettingzoo.") and ":" not in value)
    return kind == "always" or (isinstance(value, str) and ":" in value)


def code_references(model: BaseModel, path: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Every ``(key.path, value)`` of ``model`` that names a module to import or a program to run."""
    out: list[tuple[str, str]] = []
    cls = type(model).__name__
    for name in type(model).model_fields:
        value = getattr(model, name, None)
        where = (*path, name)
        kind = CODE_FIELDS.get((cls, name))
        if kind is not None and _is_code(kind, value):
            shown = " ".join(str(v) for v in value) if isinstance(value, list) else str(value)
            out.append((".".join(where), shown))
        elif isinstance(value, BaseModel):
            out.extend(code_references(value, where))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, BaseModel):
                    out.extend(code_references(v, (*where, str(i))))
    return out


def require_trust(cfg: BaseModel, where: str, trust_code: bool) -> None:
    """Refuse (``ConfigError``) to reopen the run at ``where`` when its config names code and the user did not
    pass ``--trust-code``; nothing it names has been imported when this raises."""
    if trust_code:
        return
    refs = code_references(cfg)
    if not refs:
        return
    key, value = refs[0]
    more = f" (and {len(refs) - 1} more: {', '.join(k for k, _ in refs[1:])})" if len(refs) > 1 else ""
    raise ConfigError(f"{where} names code that would run here: {key} = {value!r}{more}. A run folder is data; "
                      "pass --trust-code if you trust where this run came from and that code")
