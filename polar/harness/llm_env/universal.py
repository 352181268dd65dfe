"""The universal action set (``agent.action_format: universal``) and its per-env translators.

The model answers with one of four actions, whatever the env: ``click(x, y)``, ``type(text)``,
``press_key(key)``, ``call_api(name, params)``, written as a call (``press_key("left")``) or as JSON
(``{"action": "press_key", "key": "left"}``). :func:`parse_universal` reads it into a typed value; a
:class:`Translator` turns that into the env's native action, or raises :class:`InvalidAction` with the
reason (the runner's repair prompt shows it). Built-in translators, picked by the action space
(``translator: auto``) or by name:

- ``keys``: a Discrete space's named actions; ``press_key(name)`` -> the index.
- ``text``: a ``Text`` space; ``type(text)`` -> the string, ``press_key(k)`` -> ``keys[k]`` when configured.
- ``grid``: a Box or MultiDiscrete of shape (2,); ``click(x, y)`` -> the array, bounds-checked.
- ``commands``: ``call_api(name, params)`` -> ``table[name].format(**params)`` (``search[{query}]``), or
  without a table the ``{"name", "params"}`` command (a JSON string for a Text space).
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Protocol

import numpy as np
from gymnasium import spaces

from polar.errors import HarnessError
from polar.harness.llm_env.agent import ActionCodec, ActionList, InvalidAction, last_object_with

# ---- the actions --------------------------------------------------------------------------------------


class _Action:
    kind: ClassVar[str]

    def __str__(self) -> str:  # the call form: click(3, 4), call_api("search", {"q": "shoes"})
        return f"{self.kind}({', '.join(json.dumps(v) for v in asdict(self).values())})"  # type: ignore[call-overload]

    def as_json(self) -> dict[str, Any]:
        return {"action": self.kind, **asdict(self)}  # type: ignore[call-overload]


def _number(kind: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidAction(f"{kind}: {name} must be a number, not {value!r}")


def _text(kind: str, name: str, value: Any, empty: bool = False) -> None:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise InvalidAction(f"{kind}: {name} must be a{'' if empty else ' non-empty'} string, not {value!r}")


@dataclass(frozen=True)
class Click(_Action):
    x: float
    y: float
    kind: ClassVar[str] = "click"

    def __post_init__(self) -> None:
        _number("click", "x", self.x)
        _number("click", "y", self.y)


@dataclass(frozen=True)
class Type(_Action):
    text: str
    kind: ClassVar[str] = "type"

    def __post_init__(self) -> None:
        _text("type", "text", self.text, empty=True)


@dataclass(frozen=True)
class PressKey(_Action):
    key: str
    kind: ClassVar[str] = "press_key"

    def __post_init__(self) -> None:
        _text("press_key", "key", self.key)


@dataclass(frozen=True)
class CallApi(_Action):
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    kind: ClassVar[str] = "call_api"

    def __post_init__(self) -> None:
        _text("call_api", "name", self.name)
        if self.params is None:
            object.__setattr__(self, "params", {})
        if not isinstance(self.params, dict) or not all(isinstance(k, str) for k in self.params):
            raise InvalidAction(f"call_api: params must be a JSON object, not {self.params!r}")


UniversalAction = Click | Type | PressKey | CallApi
KINDS: dict[str, type[UniversalAction]] = {c.kind: c for c in (Click, Type, PressKey, CallApi)}


def signature(kind: str) -> str:
    """``click(x, y)``: an action's call with its parameter names."""
    return f"{kind}({', '.join(f.name for f in fields(KINDS[kind]))})"


ALL_SIGNATURES = ", ".join(signature(k) for k in KINDS)


def make_action(kind: Any, args: list[Any], kwargs: Mapping[str, Any]) -> UniversalAction:
    """The action ``kind(*args, **kwargs)``, or :class:`InvalidAction` naming what is wrong."""
    cls = KINDS.get(kind.strip().lower()) if isinstance(kind, str) else None
    if cls is None:
        raise InvalidAction(f"{kind!r} is not a universal action; use one of {ALL_SIGNATURES}")
    names = [f.name for f in fields(cls)]
    if len(args) > len(names):
        raise InvalidAction(f"{signature(cls.kind)} takes {len(names)} argument(s), got {len(args)}")
    values = dict(zip(names, args, strict=False))
    for k, v in kwargs.items():
        if k not in names:
            raise InvalidAction(f"{signature(cls.kind)} has no parameter {k!r}")
        if k in values:
            raise InvalidAction(f"{signature(cls.kind)} got {k} twice")
        values[k] = v
    missing = [n for n in names if n not in values and not (cls is CallApi and n == "params")]
    if missing:
        raise InvalidAction(f"{signature(cls.kind)} is missing {', '.join(missing)}")
    return cls(**values)


# ---- parsing ------------------------------------------------------------------------------------------

_CALL = re.compile(r"\b(click|type|press_key|call_api)\(")
_JSON_WORDS = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr, source: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Name) and node.id in _JSON_WORDS:
        return _JSON_WORDS[node.id]
    segment = ast.get_source_segment(source, node) or ""
    try:  # a JSON literal Python does not read: {"q": true}
        return json.loads(segment)
    except json.JSONDecodeError:
        raise InvalidAction(f"in {source}, {segment or 'an argument'} is not a literal value; give numbers, "
                            '"strings" or {...} objects') from None


def _last_call(text: str) -> UniversalAction | None:
    """The universal call the last ``kind(`` in ``text`` starts (None when there is none); the last one
    decides, so a call cut off at the end is an error, not a fallback to an earlier one."""
    starts = list(_CALL.finditer(text))
    if not starts:
        return None
    m = starts[-1]
    for j in (i for i in range(m.end(), min(len(text), m.end() + 4000)) if text[i] == ")"):
        source = text[m.start():j + 1]
        try:
            node = ast.parse(source, mode="eval").body
        except (SyntaxError, ValueError):
            continue  # a ")" inside a string: try the next one
        if not isinstance(node, ast.Call):
            break
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise InvalidAction(f"{source}: write the arguments out (no * or **)")
        return make_action(m.group(1), [_literal(a, source) for a in node.args],
                           {str(k.arg): _literal(k.value, source) for k in node.keywords})
    raise InvalidAction(f"{text[m.start():][:40]!r} is not a complete call; write it like {signature(m.group(1))}")


def parse_universal(content: str | None) -> UniversalAction:
    """The universal action in an answer: the last JSON object with an ``"action"`` key (its value a kind
    with the parameters beside it, or a whole call), else the last call ``kind(...)`` in the text."""
    text = content or ""
    obj = last_object_with(text, "action")
    if obj is not None:
        kind = obj["action"]
        rest = {k: v for k, v in obj.items() if k != "action"}
        if isinstance(kind, str) and "(" in kind and not rest:
            call = _last_call(kind)
            if call is not None:
                return call
        return make_action(kind, [], rest)
    call = _last_call(text)
    if call is not None:
        return call
    if not text.strip():
        raise InvalidAction("the answer is empty; reply with one action")
    raise InvalidAction(f"no action in the answer; end it with one of {ALL_SIGNATURES}")


# ---- translators --------------------------------------------------------------------------------------


class Translator(ActionList, Protocol):
    """A universal action -> the env's native action. ``describe()`` lists the actions this env accepts
    (the prompt shows it), ``example()`` is one of them; ``translate`` raises :class:`InvalidAction`
    with the reason when an action does not apply."""

    def describe(self) -> str: ...

    def example(self) -> UniversalAction: ...

    def translate(self, action: UniversalAction) -> Any: ...


def not_here(action: UniversalAction, translator: Translator) -> InvalidAction:
    return InvalidAction(f"{action} does not apply here; this env takes {translator.describe()}")


def _string_table(what: str, table: Any) -> dict[str, str]:
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
        raise HarnessError(f"agent.translator_kwargs.{what} must map names to strings, got {table!r}")
    return {k.lower(): v for k, v in table.items()}


def _fit_text(space: spaces.Space | None, value: str, what: str) -> str:
    """``value`` when the Text ``space`` holds it, else :class:`InvalidAction` saying why."""
    if isinstance(space, spaces.Text):
        if not space.min_length <= len(value) <= space.max_length:
            raise InvalidAction(f"{what} is {len(value)} characters; this env takes {space.min_length} to "
                                f"{space.max_length}")
        bad = sorted(set(value) - set(space.character_set))
        if bad:
            raise InvalidAction(f"{what} holds characters this env does not take: {''.join(bad[:12])!r}")
    return value


class KeyTranslator:
    """Discrete actions: ``press_key(name)`` -> the index of the action named ``name`` (case-insensitive)."""

    def __init__(self, space: spaces.Space | None, names: list[str] | None = None) -> None:
        if not isinstance(space, spaces.Discrete):
            raise HarnessError(f"translator keys needs a Discrete action space, not {space}")
        self.codec = ActionCodec(space, names)
        self.keys = self.codec.names or [str(i) for i in range(int(space.start), int(space.start) + int(space.n))]

    def describe(self) -> str:
        return f"press_key(key) with key one of {', '.join(self.keys)}"

    def example(self) -> UniversalAction:
        return PressKey(self.keys[0])

    def translate(self, action: UniversalAction) -> Any:
        if not isinstance(action, PressKey):
            raise not_here(action, self)
        try:
            return self.codec.decode(action.key)
        except InvalidAction as e:
            raise InvalidAction(f"{action}: {e}") from None


class TextTranslator:
    """A Text space: ``type(text)`` -> the string; ``press_key(k)`` -> ``keys[k]`` for the configured keys."""

    def __init__(self, space: spaces.Space | None, keys: dict[str, str] | None = None) -> None:
        if not isinstance(space, spaces.Text):
            raise HarnessError(f"translator text needs a Text action space, not {space}")
        self.space, self.keys = space, _string_table("keys", keys or {})

    def describe(self) -> str:
        keys = f"; press_key(key) with key one of {', '.join(self.keys)}" if self.keys else ""
        return f"type(text) with {self.space.min_length} to {self.space.max_length} characters{keys}"

    def example(self) -> UniversalAction:
        return Type("hello")

    def translate(self, action: UniversalAction) -> Any:
        if isinstance(action, Type):
            return _fit_text(self.space, action.text, str(action))
        if isinstance(action, PressKey) and self.keys:
            if action.key.lower() not in self.keys:
                raise InvalidAction(f"{action}: no such key here; press one of: {', '.join(self.keys)}")
            return _fit_text(self.space, self.keys[action.key.lower()], str(action))
        raise not_here(action, self)


class GridTranslator:
    """A Box or MultiDiscrete action of shape (2,): ``click(x, y)`` -> ``array([x, y])``, inside its bounds."""

    def __init__(self, space: spaces.Space | None) -> None:
        if not isinstance(space, spaces.Box | spaces.MultiDiscrete) or space.shape != (2,):
            raise HarnessError(f"translator grid needs a Box or MultiDiscrete action space of shape (2,) (x, y), "
                               f"not {space}")
        self.space = space
        if isinstance(space, spaces.MultiDiscrete):
            self.low, self.high = space.start.astype(float), (space.start + space.nvec - 1).astype(float)
        else:
            self.low, self.high = space.low.astype(float), space.high.astype(float)
        if not (np.all(np.isfinite(self.low)) and np.all(np.isfinite(self.high))):
            raise HarnessError(f"translator grid needs finite bounds (a grid or a screen), not {space}")
        self.integer = np.issubdtype(space.dtype, np.integer)

    def describe(self) -> str:
        what = "integers" if self.integer else "numbers"
        return (f"click(x, y) with {what} x from {self.low[0]:g} to {self.high[0]:g} and y from {self.low[1]:g} "
                f"to {self.high[1]:g}")

    def example(self) -> UniversalAction:
        x, y = (int(v) if self.integer else float(v) for v in self.low)
        return Click(x, y)

    def translate(self, action: UniversalAction) -> Any:
        if not isinstance(action, Click):
            raise not_here(action, self)
        xy = np.array([action.x, action.y], dtype=float)
        if self.integer and not np.array_equal(xy, np.round(xy)):
            raise InvalidAction(f"{action}: x and y must be integers here")
        if np.any(xy < self.low) or np.any(xy > self.high):
            raise InvalidAction(f"{action} is off the grid; {self.describe()}")
        return xy.astype(self.space.dtype)


class CommandTranslator:
    """``call_api(name, params)`` -> a command: ``table[name].format(**params)`` (e.g. ``search[{query}]``);
    without a table, the ``{"name": ..., "params": ...}`` dict (a JSON string for a Text space)."""

    def __init__(self, space: spaces.Space | None, table: dict[str, str] | None = None) -> None:
        self.space, self.table = space, _string_table("table", table) if table is not None else None
        self.params: dict[str, list[str]] = {}
        for name, template in (self.table or {}).items():
            try:
                parts = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
            except ValueError as e:
                raise HarnessError(f"agent.translator_kwargs.table[{name!r}] {template!r} is not a template: {e}") from None
            if any(not p.isidentifier() for p in parts):
                raise HarnessError(f"agent.translator_kwargs.table[{name!r}] {template!r}: name every field, "
                                   "e.g. 'search[{query}]'")
            self.params[name] = list(dict.fromkeys(parts))
        if self.table == {}:
            raise HarnessError("agent.translator_kwargs.table is empty; give one template per API name")

    def _apis(self) -> str:
        return ", ".join(f"{n} (params: {', '.join(p) or 'none'})" for n, p in self.params.items())

    def describe(self) -> str:
        if self.table is None:
            return "call_api(name, params) with name a string and params a JSON object"
        return f"call_api(name, params) with name one of {self._apis()}"

    def example(self) -> UniversalAction:
        if self.table is None:
            return CallApi("name", {})
        name = next(iter(self.params))
        return CallApi(name, {p: "..." for p in self.params[name]})

    def translate(self, action: UniversalAction) -> Any:
        if not isinstance(action, CallApi):
            raise not_here(action, self)
        if self.table is None:
            command = {"name": action.name, "params": action.params}
            return _fit_text(self.space, json.dumps(command), str(action)) if isinstance(self.space, spaces.Text) else command
        name = action.name.lower()
        if name not in self.table:
            raise InvalidAction(f"{action}: no API {action.name!r} here; call one of {self._apis()}")
        want, got = self.params[name], set(action.params)
        if set(want) != got:
            missing, extra = [p for p in want if p not in got], sorted(got - set(want))
            raise InvalidAction(f"{action}: {name} takes params {', '.join(want) or 'none'}"
                                + (f"; missing {', '.join(missing)}" if missing else "")
                                + (f"; unknown {', '.join(extra)}" if extra else ""))
        values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in action.params.items()}
        return _fit_text(self.space, self.table[name].format(**values), str(action))


BUILTIN: dict[str, Callable[..., Translator]] = {
    "keys": KeyTranslator, "text": TextTranslator, "grid": GridTranslator, "commands": CommandTranslator,
}


def auto_translator(space: spaces.Space | None, kwargs: Mapping[str, Any]) -> str:
    """The built-in translator for ``space``: keys (Discrete), commands (Text with a table), text (Text),
    grid (a Box or MultiDiscrete of shape (2,))."""
    if isinstance(space, spaces.Discrete):
        return "keys"
    if isinstance(space, spaces.Text):
        return "commands" if "table" in kwargs else "text"
    if isinstance(space, spaces.Box | spaces.MultiDiscrete) and space.shape == (2,):
        return "grid"
    raise HarnessError(f"no built-in universal-action translator fits the action space {space}; set "
                       "agent.translator to 'module:function' (a factory (action_space, **translator_kwargs) "
                       "returning a Translator)")


def build_translator(spec: str | None, space: spaces.Space | None, names: list[str] | None = None,
                     kwargs: Mapping[str, Any] | None = None, factory: Callable[..., Any] | None = None) -> Translator:
    """The translator ``spec`` (auto, a built-in name, or ``module:function`` imported as ``factory``)
    for ``space``; a :class:`HarnessError` says why none fits."""
    kwargs = dict(kwargs or {})
    if factory is not None:
        try:
            made = factory(space, **kwargs)
        except HarnessError:
            raise
        except Exception as e:
            raise HarnessError(f"agent.translator {spec} failed on the action space {space}: {type(e).__name__}: "
                               f"{e}") from None
        missing = [m for m in ("describe", "example", "translate") if not callable(getattr(made, m, None))]
        if missing:
            raise HarnessError(f"agent.translator {spec} returned a {type(made).__name__}, which has no "
                               f"{', '.join(missing)} method(s); a Translator has describe(), example() and "
                               "translate(action)")
        return made  # type: ignore[no-any-return]
    name = auto_translator(space, kwargs) if spec in (None, "auto") else str(spec)
    if name not in BUILTIN:
        raise HarnessError(f"agent.translator {name!r} is not a built-in translator ({', '.join(BUILTIN)})")
    options = [p for p in inspect.signature(BUILTIN[name]).parameters if p not in ("space", "names")]
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        raise HarnessError(f"agent.translator_kwargs has {', '.join(unknown)}, which the {name} translator does not "
                           f"take (it takes: {', '.join(options) or 'no options'})")
    if name == "keys":  # the action names: agent.actions, else the env's text renderer's
        return KeyTranslator(space, names)
    return BUILTIN[name](space, **kwargs)
