"""Strict typed config models and readable validation errors.

Every config section is a ``StrictModel``: unknown keys are errors, and errors name the full key
path, what was wrong, and the closest valid key ("did you mean").
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from polar.errors import ConfigError


class StrictModel(BaseModel):
    """Base for every config section: unknown keys fail, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


class NStepReturnKwargs(StrictModel):
    """Base of the kwargs of a replay algorithm with an n-step return (DQN, SAC): ``n_steps`` means env steps per
    env in one fragment (PPO, APPO), so an old config's ``n_steps`` is refused with the new name."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_n_steps(cls, data: Any) -> Any:
        if isinstance(data, dict) and "n_steps" in data:
            algo = cls.__name__.removesuffix("Kwargs").lower()
            raise ConfigError(f"policy.kwargs.n_steps: {algo} has no n_steps (PPO's and APPO's steps per env in a "
                              "fragment); did you mean n_step_return (the n-step return's horizon)? Rename the key")
        return data


def did_you_mean(name: str, candidates: list[str] | set[str], n: int = 3) -> str:
    """Return ' (did you mean: a, b?)' for the closest candidates, or '' when nothing is close."""
    close = difflib.get_close_matches(str(name), sorted(candidates), n=n, cutoff=0.5)
    return f" (did you mean: {', '.join(close)}?)" if close else ""


def format_validation_error(err: ValidationError, model: Any, source: str = "config") -> str:
    """Turn a pydantic ValidationError into one line per problem: path, what, and how to fix it."""
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"])
        path = ".".join(str(p) for p in _display_loc(model, loc)) or "<root>"
        kind = e["type"]
        if kind == "extra_forbidden":
            key = str(loc[-1])
            owner = _owner_fields(model, loc)
            hint = did_you_mean(key, owner) if owner else ""
            valid = f" Valid keys here: {', '.join(sorted(owner))}." if owner else ""
            lines.append(f"{source}: unknown key '{path}'{hint}.{valid}")
        elif kind == "run_section":  # a section of the other kind of run (polar.config.run)
            lines.append(f"{source}: {e['msg']}.")
        elif kind == "missing":
            lines.append(f"{source}: missing required key '{path}'.")
        elif kind in ("union_tag_invalid", "literal_error"):
            lines.append(f"{source}: '{path}': {e['msg']} (got {e.get('input')!r}).")
        else:
            got = e.get("input")
            got_s = repr(got)
            if len(got_s) > 80:
                got_s = got_s[:77] + "..."
            lines.append(f"{source}: '{path}': {e['msg']} (got {got_s} of type {type(got).__name__}).")
    return "\n".join(lines)


def _display_loc(model: Any, loc: tuple[Any, ...]) -> list[Any]:
    """Drop discriminated-union tags (``policy.ppo.kwargs`` -> ``policy.kwargs``) from an error location."""
    out: list[Any] = []
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel) and str(part) in current.model_fields:
            out.append(part)
            current = current.model_fields[str(part)].annotation
            continue
        is_model = isinstance(current, type) and issubclass(current, BaseModel)
        optional = _optional_model(current) if current is not None and not is_model else None
        if optional is not None:  # ``Model | None``: pydantic puts no tag in the location; this part is a key
            out.append(part)
            field = optional.model_fields.get(str(part))
            current = field.annotation if field is not None else None
            continue
        member = _union_member(current, str(part)) if current is not None and not is_model else None
        if member is not None and not isinstance(part, int):
            current = member  # a union tag, not a key the user wrote
            continue
        out.append(part)
        current = None
    return out


def _optional_model(annotation: Any) -> Any:
    """The model of a ``Model | None`` annotation, else None."""
    from typing import get_args

    args = get_args(annotation)
    if len(args) == 2 and type(None) in args:
        other = args[0] if args[1] is type(None) else args[1]
        if isinstance(other, type) and issubclass(other, BaseModel):
            return other
    return None


def _owner_fields(model: Any, loc: tuple[Any, ...]) -> set[str]:
    """Field names (and aliases) valid at the location of an unknown key, best effort."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is not None:
                current = field.annotation
                continue
        # inside a union: pick the member whose discriminator literal equals part
        current = _union_member(current, str(part))
        if current is None:
            return set()
    current = _union_member(current, None) if not (isinstance(current, type) and issubclass(current, BaseModel)) else current
    if current is None:
        return set()
    names = set(current.model_fields)
    names |= {f.alias for f in current.model_fields.values() if f.alias}
    return names


def _union_member(annotation: Any, tag: str | None) -> Any:
    from typing import Annotated, Literal, get_args, get_origin

    from pydantic import Tag

    members: list[Any] = []
    tagged: dict[str, Any] = {}  # members of a union with a callable discriminator: Annotated[Model, Tag(t)]

    def collect(a: Any) -> None:
        if isinstance(a, type) and issubclass(a, BaseModel):
            members.append(a)
            return
        if get_origin(a) is Annotated:
            inner, *meta = get_args(a)
            for m in meta:
                if isinstance(m, Tag) and isinstance(inner, type) and issubclass(inner, BaseModel):
                    tagged[m.tag] = inner
            collect(inner)
            return
        for arg in get_args(a):
            collect(arg)

    collect(annotation)
    if tag is None:
        return members[0] if len(members) == 1 else None
    if tag in tagged:
        return tagged[tag]
    for m in members:
        for f in m.model_fields.values():
            if get_origin(f.annotation) is Literal and tag in get_args(f.annotation):
                return m
    return members[0] if len(members) == 1 else None


def validate(model: Any, data: Any, source: str = "config") -> Any:
    """Validate ``data`` against ``model`` (a model class, or a union such as ``RunConfig``); raise ConfigError
    with readable lines on failure."""
    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model.model_validate(data)
        return _adapter(model).validate_python(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, model, source)) from None


_ADAPTERS: dict[int, Any] = {}


def _adapter(annotation: Any) -> Any:
    """One ``TypeAdapter`` per annotation (building one compiles a validator)."""
    from pydantic import TypeAdapter

    key = id(annotation)
    if key not in _ADAPTERS:
        _ADAPTERS[key] = (annotation, TypeAdapter(annotation))
    return _ADAPTERS[key][1]
