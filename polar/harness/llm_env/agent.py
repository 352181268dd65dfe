"""The LLM agent's parts, each a pure function of its inputs: observations to text, the action space to
a list the prompt shows, an answer to an action, and the prompt itself (goal, actions, history window).

Failures are values the runner records, never crashes: an answer that does not parse, or names an
action the space does not hold, raises :class:`InvalidAction` with the reason the repair prompt shows
the model; an observation no normaliser can write raises :class:`ObservationError` (the session ERRORs
with that reason).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces

from polar.errors import HarnessError


class InvalidAction(Exception):
    """The model's answer is not a valid action; ``str(e)`` is the reason, shown to the model on repair."""


class ObservationError(HarnessError):
    """An observation that cannot be written as text."""


# ---- observations -------------------------------------------------------------------------------------

_ANSI_HIGHLIGHT = re.compile(r"\x1b\[4\d(?:;\d+)*m(.*?)\x1b\[0m", re.DOTALL)  # background colour: the agent
_ANSI_ANY = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """An ANSI render as plain text; a cell drawn with a background colour (the agent, usually) becomes ``[x]``."""
    return _ANSI_ANY.sub("", _ANSI_HIGHLIGHT.sub(lambda m: f"[{m.group(1)}]", text)).strip("\n")


def _is_image(space: spaces.Space) -> bool:
    return isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3 and space.shape[-1] in (1, 3, 4)


def _plain(value: Any) -> Any:
    """numpy scalars/arrays and tuples as JSON-ready Python values."""
    if isinstance(value, np.ndarray):
        return np.round(value, 4).tolist() if value.dtype.kind == "f" else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    if value is None or isinstance(value, str | int | bool):
        return value
    raise ObservationError(f"a {type(value).__name__} cannot be written as JSON")


def observation_text(obs: Any, space: spaces.Space | None, mode: str = "auto",
                     image_to_text: Callable[[Any], str] | None = None, render: Callable[[], Any] | None = None,
                     _key: str = "observation") -> str:
    """``obs`` as text. ``mode``: text (a string as is), json, ansi (``render()``, colours stripped),
    discrete, box, dict, or auto (by the space). Images need ``image_to_text``."""
    if mode == "ansi":
        if render is None:
            raise ObservationError("observation: ansi needs an env that renders text")
        frame = render()
        if not isinstance(frame, str):
            raise ObservationError(f"observation: ansi needs the env's render() to return text (it returned "
                                   f"{type(frame).__name__}); set harness.kwargs.render_mode: ansi")
        return strip_ansi(frame)
    if mode == "text" or (mode == "auto" and isinstance(obs, str)):
        if not isinstance(obs, str):
            raise ObservationError(f"observation: text needs string observations, got {type(obs).__name__}")
        return obs
    if mode == "json":
        return json.dumps(_plain(obs))
    if (space is not None and _is_image(space)) or (isinstance(obs, np.ndarray) and obs.dtype == np.uint8 and obs.ndim == 3):
        if image_to_text is None:
            raise ObservationError(f"{_key} is an image {getattr(obs, 'shape', '')}; set agent.image_to_text to a "
                                   "'module:function' that describes it in text")
        text = image_to_text(obs)
        if not isinstance(text, str):
            raise ObservationError(f"agent.image_to_text returned {type(text).__name__}, not a string")
        return text
    if isinstance(space, spaces.Dict) or isinstance(obs, dict):
        subs = space.spaces if isinstance(space, spaces.Dict) else {}
        if not isinstance(obs, dict):
            raise ObservationError(f"{_key}: a Dict space gave a {type(obs).__name__}")
        return "\n".join(f"{k}: {observation_text(v, subs.get(k), 'auto', image_to_text, None, f'{_key}.{k}')}"
                         for k, v in obs.items())
    if isinstance(space, spaces.Discrete) or isinstance(obs, int | np.integer):
        n = f" (of {space.n})" if isinstance(space, spaces.Discrete) else ""
        return f"state {int(obs)}{n}"
    if isinstance(obs, np.ndarray | list | tuple | float | np.floating):
        values = _plain(obs)
        if isinstance(obs, np.ndarray) and obs.dtype.kind == "f" and not np.all(np.isfinite(obs)):
            raise ObservationError(f"{_key} holds NaN or inf: {values}")
        return json.dumps(values)
    raise ObservationError(f"{_key} of type {type(obs).__name__} (space {space}) has no text form; "
                           "set agent.observation (json, ansi, text) or agent.image_to_text")


# ---- actions ------------------------------------------------------------------------------------------


class ActionList(Protocol):
    """What the prompt shows of the actions: an :class:`ActionCodec`, or a universal-action ``Translator``."""

    def describe(self) -> str: ...

    def example(self) -> Any: ...


class ActionCodec:
    """An action space as the prompt shows it, and an answer's value back into an env action."""

    def __init__(self, space: spaces.Space, names: list[str] | tuple[str, ...] | None = None) -> None:
        self.space = space
        self.names: list[str] | None = None
        if isinstance(space, spaces.Discrete):
            if names is not None:
                if len(names) != int(space.n):
                    raise HarnessError(f"agent.actions names {len(names)} actions but the action space is "
                                       f"Discrete({space.n}); give one name per action, in index order")
                self.names = [str(n) for n in names]
        elif names is not None:
            raise HarnessError(f"agent.actions names Discrete actions, but the action space is {space}")
        elif not isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary | spaces.Text):
            raise HarnessError(f"the built-in LLM agent cannot describe the action space {space}; it handles "
                               "Discrete, Box, MultiDiscrete, MultiBinary and Text")

    def describe(self) -> str:
        s = self.space
        if isinstance(s, spaces.Discrete):
            if self.names:
                return ", ".join(self.names)
            return f"an integer from {int(s.start)} to {int(s.start) + int(s.n) - 1}"
        if isinstance(s, spaces.Box):
            return (f"a list of {int(np.prod(s.shape))} numbers, each between {float(np.min(s.low)):g} and "
                    f"{float(np.max(s.high)):g}")
        if isinstance(s, spaces.MultiDiscrete):
            return f"a list of {len(s.nvec)} integers, the i-th from 0 to nvec[i]-1 with nvec = {s.nvec.tolist()}"
        if isinstance(s, spaces.Text):  # a command or a move, as the observation says to write it
            return f"a move written as the observation says, as text of at most {s.max_length} characters"
        return f"a list of {int(np.prod(s.shape))} values, each 0 or 1"

    def example(self) -> Any:
        s = self.space
        if isinstance(s, spaces.Discrete):
            return self.names[0] if self.names else int(s.start)
        if isinstance(s, spaces.Text):
            return "your move"
        return _plain(np.zeros(s.shape, dtype=float).ravel()) if isinstance(s, spaces.Box) else [0] * int(np.prod(s.shape))

    def json_schema(self) -> dict[str, Any]:
        if isinstance(self.space, spaces.Discrete):
            return {"type": "string", "enum": self.names} if self.names else {"type": "integer"}
        if isinstance(self.space, spaces.Text):
            return {"type": "string"}
        return {"type": "array", "items": {"type": "number"}}

    def decode(self, value: Any) -> Any:
        """The env action for ``value`` (a name, an index or a list), or :class:`InvalidAction` saying why not."""
        s = self.space
        if isinstance(s, spaces.Discrete):
            lo, hi = int(s.start), int(s.start) + int(s.n) - 1
            if isinstance(value, str):
                text = value.strip().strip("'\"").lower()
                if self.names:
                    for i, name in enumerate(self.names):
                        if text == name.lower():
                            return lo + i
                if re.fullmatch(r"[-+]?\d+", text):
                    value = int(text)
                else:
                    options = ", ".join(self.names) if self.names else f"{lo}..{hi}"
                    raise InvalidAction(f"{value!r} is not an action; choose one of: {options}")
            if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
                raise InvalidAction(f"{value!r} is not an action; give an action name or index")
            if not lo <= int(value) <= hi:
                raise InvalidAction(f"action {int(value)} is out of range: the actions are {lo}..{hi}"
                                    + (f" ({', '.join(self.names)})" if self.names else ""))
            return int(value)
        if isinstance(s, spaces.Text):  # the string as is: whether it is a legal move is the env's to say
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise InvalidAction(f"{value!r} is not a move; give {self.describe()}")
            text = str(value).strip()
            if not text:
                raise InvalidAction("the move is empty; give the move as text")
            if not s.contains(text):
                bad = "".join(sorted(set(text) - set(s.character_set)))[:12]
                raise InvalidAction(f"{text[:40]!r} is not a move here: " + (
                    f"it holds characters this env does not take: {bad!r}" if bad else
                    f"give {s.min_length} to {s.max_length} characters"))
            return text
        if not isinstance(value, list):
            raise InvalidAction(f"{value!r} is not a list; give {self.describe()}")
        try:
            arr = np.asarray(value, dtype=float).reshape(s.shape)
        except (ValueError, TypeError):
            raise InvalidAction(f"{value!r} is not {self.describe()}") from None
        if isinstance(s, spaces.Box):
            if not np.all(np.isfinite(arr)) or np.any(arr < s.low) or np.any(arr > s.high):
                raise InvalidAction(f"{value!r} is out of range: give {self.describe()}")
            return arr.astype(s.dtype)
        out = arr.astype(np.int64)
        if not np.array_equal(out, arr) or not s.contains(out.astype(s.dtype)):
            raise InvalidAction(f"{value!r} is out of range: give {self.describe()}")
        return out.astype(s.dtype)


# ---- answers ------------------------------------------------------------------------------------------

_DECODER = json.JSONDecoder()


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects in ``text``, outermost only (an object nested in another is part of it), in order."""
    i = text.find("{")
    while i != -1:
        try:
            obj, end = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            yield obj
        i = text.find("{", end)


def last_object_with(text: str, key: str) -> dict[str, Any] | None:
    """The last JSON object in ``text`` that has ``key``, or None."""
    found = None
    for obj in json_objects(text):
        if key in obj:
            found = obj
    return found


def answer_value(fmt: str, content: str | None, tool_calls: list[Any] | None, regex: str | None = None) -> Any:
    """The action value in an answer: the last ``{"action": ...}`` object (json), the ``act`` tool call's
    ``action`` argument (function_call), or group 1 of the last ``regex`` match (regex)."""
    text = content or ""
    if fmt == "function_call":
        for call in tool_calls or []:
            fn = call.function
            if fn.name != "act":
                raise InvalidAction(f"called unknown tool {fn.name!r}; call act(action=...)")
            try:
                args = json.loads(fn.arguments or "{}")
            except json.JSONDecodeError as e:
                raise InvalidAction(f"the act call's arguments are not JSON ({e.msg})") from None
            if not isinstance(args, dict) or "action" not in args:
                raise InvalidAction("the act call has no 'action' argument")
            return args["action"]
        raise InvalidAction("no tool call; call act(action=...) with your action")
    if fmt == "regex":
        matches = re.findall(regex or "", text)
        if not matches:
            raise InvalidAction(f"the answer does not match {regex!r}")
        last = matches[-1]
        return last[0] if isinstance(last, tuple) else last
    obj = last_object_with(text, "action")
    if obj is not None:
        return obj["action"]
    if not text.strip():
        raise InvalidAction('the answer is empty; reply with {"action": ...}')
    raise InvalidAction('no JSON object with an "action" key in the answer; reply with {"action": ...}')


# ---- prompt -------------------------------------------------------------------------------------------


def format_hint(fmt: str, codec: ActionList, regex: str | None = None) -> str:
    if fmt == "universal":  # codec is a Translator: its example is a universal action
        ex = codec.example()
        return f"Reply with one action, as a call such as {ex} or as JSON such as {json.dumps(ex.as_json())}."
    if fmt == "function_call":
        return "Call the tool act with your action."
    if fmt == "regex":
        return f"End your answer with your action in the form matching the regex {regex}."
    return f'Reply with a JSON object on one line, for example {json.dumps({"action": codec.example()})}.'


def system_prompt(goal: str, codec: ActionList, fmt: str, regex: str | None = None) -> str:
    return f"{goal}\nAvailable actions: {codec.describe()}.\n{format_hint(fmt, codec, regex)}"


def act_tool(codec: ActionCodec) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": "act", "description": "take one action in the environment",
        "parameters": {"type": "object", "properties": {"action": codec.json_schema()}, "required": ["action"]}}}


def window(system: str, steps: list[list[dict[str, Any]]], history_turns: int | None) -> list[dict[str, Any]]:
    """The messages of one call: the system prompt and the last ``history_turns`` past steps (all when None)
    before the current one (``steps[-1]``)."""
    past, current = steps[:-1], steps[-1]
    if history_turns is not None:
        past = past[len(past) - history_turns:] if history_turns else []
    return [{"role": "system", "content": system}, *(m for step in past for m in step), *current]
