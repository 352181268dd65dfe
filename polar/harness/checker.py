"""Conformance checks for any environment harness, in the spirit of Gymnasium's ``check_env``.

``check_harness(target)`` builds the env (in process or through its connector), then checks the
reset/step signatures, that every observation lies in its space, seeding determinism, truncation
handling and close. Each violation says what was expected, what was received, and how to fix it.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from polar.config.harness import CustomHarnessConfig, GymnasiumHarnessConfig
from polar.errors import PolarError, ProtocolError

if TYPE_CHECKING:
    from polar.config.run import AnyHarnessConfig

SUPPORTED_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Dict)


@dataclass
class Violation:
    check: str
    expected: str
    received: str
    fix: str
    details: str = ""  # e.g. the connector's traceback and last output lines, printed below the violation

    def __str__(self) -> str:
        text = f"[{self.check}] expected {self.expected}; received {self.received}. Fix: {self.fix}"
        return f"{text}\n{self.details}" if self.details else text


def _split_error(e: BaseException) -> tuple[str, str]:
    """(first line, the rest): a connector error's first line says what failed; the rest is the
    connector's traceback and last output lines, which the report keeps (``polar run`` shows them too)."""
    lines = str(e).splitlines() or [type(e).__name__]
    rest = "\n".join(lines[1:]).strip("\n")
    tb = getattr(e, "remote_traceback", "") or ""
    if tb and tb.strip() not in rest:
        rest = f"{rest}\n{tb}".strip("\n")
    return lines[0], rest


@dataclass
class CheckReport:
    target: str
    passed: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class _Stop(Exception):
    """A violation that makes later checks meaningless."""


def describe_mismatch(obs: Any, space: spaces.Space, where: str = "observation") -> str | None:
    """Why ``obs`` is not in ``space`` (None when it is): names the key, index, value and bound."""
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, dict):
            return f"{where} is a {type(obs).__name__}, not a dict with keys {sorted(space.spaces)}"
        missing, extra = set(space.spaces) - set(obs), set(obs) - set(space.spaces)
        if missing or extra:
            return f"{where} keys {sorted(obs)} (missing {sorted(missing)}, unexpected {sorted(extra)})"
        for k, sub in space.spaces.items():
            why = describe_mismatch(obs[k], sub, f"{where}[{k!r}]")
            if why:
                return why
        return None
    if isinstance(space, spaces.Discrete):
        if not isinstance(obs, (numbers.Integral, np.integer)) and not (isinstance(obs, np.ndarray) and obs.shape == ()):
            return f"{where} is {obs!r} of type {type(obs).__name__}, not an int"
        return None if space.contains(obs) else f"{where} = {obs!r} is outside {space}"
    arr = np.asarray(obs)
    shape = getattr(space, "shape", None)
    if shape is not None and arr.shape != shape:
        return f"{where} has shape {arr.shape}, the space says {shape}"
    if isinstance(space, spaces.Box):
        if arr.dtype != space.dtype:
            return f"{where} has dtype {arr.dtype}, the space says {space.dtype}"
        inside = (arr >= space.low) & (arr <= space.high)
        if arr.dtype.kind == "f":
            inside &= ~np.isnan(arr)
        bad = np.argwhere(~inside)
        if bad.size:
            idx = tuple(int(i) for i in bad[0])
            return (f"{where}{list(idx) if idx else ''} = {arr[idx].item()!r} is outside [{np.broadcast_to(space.low, arr.shape)[idx]}, "
                    f"{np.broadcast_to(space.high, arr.shape)[idx]}] ({len(bad)} value(s) out of bounds)")
        return None
    return None if space.contains(arr.astype(space.dtype) if arr.dtype.kind in "biuf" else arr) else f"{where} = {arr.tolist()!r} is outside {space}"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)


class _Checker:
    def __init__(self, report: CheckReport, env: gym.Env, steps: int, seed: int) -> None:
        self.report, self.env, self.steps, self.seed = report, env, steps, seed

    def fail(self, check: str, expected: str, received: str, fix: str, stop: bool = False, details: str = "") -> None:
        self.report.violations.append(Violation(check, expected, received, fix, details))
        if stop:
            raise _Stop

    def spaces(self) -> None:
        for name in ("observation_space", "action_space"):
            space = getattr(self.env, name, None)
            if not isinstance(space, SUPPORTED_SPACES):
                self.fail("spaces", f"{name} to be one of Box, Discrete, MultiDiscrete, MultiBinary, Dict",
                          repr(space), f"declare {name} as a gymnasium.spaces instance", stop=True)
        self.report.passed.append("spaces are declared and supported")

    def _reset(self, seed: int | None) -> Any:
        out = self.env.reset(seed=seed)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            got = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
            self.fail("reset", "reset(seed=...) to return (obs, info) with info a dict", got,
                      "return `obs, {}` from reset (connectors may return just obs; polar adds the info)", stop=True)
        return out[0]

    def _step(self, action: Any) -> tuple:
        out = self.env.step(action)
        if not (isinstance(out, tuple) and len(out) == 5):
            got = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
            self.fail("step", "step(action) to return (obs, reward, terminated, truncated, info)", got,
                      "return the Gymnasium five-tuple (connectors may return (obs, reward, done, info))", stop=True)
        return out

    def reset_and_step(self) -> None:
        if self._obs_in_space(self._reset(self.seed), "reset"):
            self.report.passed.append("reset(seed=...) returns (obs, info) inside observation_space")
        self.env.action_space.seed(self.seed)
        seen: set[str] = set()
        episodes, length, longest = 0, 0, 0
        for _ in range(self.steps):
            obs, reward, terminated, truncated, info = self._step(self.env.action_space.sample())
            length += 1
            if "obs" not in seen and not self._obs_in_space(obs, "step"):
                seen.add("obs")  # report the first bad observation only
            if "reward" not in seen and not (isinstance(reward, (numbers.Real, np.number)) and not isinstance(reward, (bool, np.bool_))):
                seen.add("reward")
                self.fail("step", "reward to be a real number (float)", f"{reward!r} of type {type(reward).__name__}",
                          "return float(reward) from step")
            for name, flag in (("terminated", terminated), ("truncated", truncated)):
                if name not in seen and not isinstance(flag, (bool, np.bool_)):
                    seen.add(name)
                    self.fail("step", f"{name} to be a bool", f"{flag!r} of type {type(flag).__name__}", f"return bool({name})")
            if "info" not in seen and not isinstance(info, dict):
                seen.add("info")
                self.fail("step", "info to be a dict", type(info).__name__, "return {} when there is nothing to say")
            if terminated or truncated:
                if terminated and truncated and "both" not in seen:
                    seen.add("both")
                    self.report.warnings.append("an episode ended both terminated and truncated; learners treat it as terminated")
                episodes, longest, length = episodes + 1, max(longest, length), 0
                self._reset(None)
        if not any(v.check == "step" for v in self.report.violations):
            self.report.passed.append(f"step() returns the five-tuple with valid types for {self.steps} steps")
        if episodes == 0:
            self.report.warnings.append(
                f"no episode ended within {self.steps} random steps; add a step limit reported as truncated=True "
                "so learners can bootstrap (e.g. gymnasium.wrappers.TimeLimit)"
            )
        else:
            self.report.passed.append(f"episodes end and reset cleanly ({episodes} in {self.steps} steps, longest {max(longest, length)})")

    def _obs_in_space(self, obs: Any, where: str) -> bool:
        why = describe_mismatch(obs, self.env.observation_space, f"{where}() observation")
        if why:
            self.fail("observation space", f"every observation inside {self.env.observation_space}", why,
                      "widen the declared observation_space or clip/fix the observation (and its dtype)")
        return why is None

    def determinism(self, n: int = 30) -> None:
        if getattr(self.env, "reset_accepts_seed", True) is False:  # a connector whose reset() takes no seed
            name = getattr(self.env, "connector_name", type(self.env).__name__)
            self.report.warnings.append(
                f"{name}.reset() takes no seed, so reset(seed=s) cannot replay an episode: evaluation seeds and "
                "`polar check --seed` do not choose its episodes, and a run repeats only as a whole, from "
                "connector_spec.config.seed (each copy gets its own seed derived from it; without that key its "
                "copies may play identical episodes). To replay episodes, accept the seed: "
                "def reset(self, seed=None), reseeding the game's RNG when seed is not None"
            )
            return

        def rollout(seed: int) -> list:
            trace = [self._reset(seed)]
            self.env.action_space.seed(seed)
            for _ in range(n):
                obs, reward, term, trunc, _ = self._step(self.env.action_space.sample())
                trace += [obs, reward, term, trunc]
                if term or trunc:
                    trace.append(self._reset(None))
            return trace

        a, b = rollout(self.seed + 1), rollout(self.seed + 1)
        for k, (x, y) in enumerate(zip(a, b, strict=False)):
            if not _same(x, y):
                self.fail("seeding", f"the same trajectory from reset(seed={self.seed + 1}) twice with the same actions",
                          f"a difference after {k // 4} step(s)",
                          "draw all randomness from the seed given to reset (e.g. np.random.default_rng(seed)); "
                          "connectors: accept `seed` in reset(self, seed=None)")
                return
        if all(_same(x, y) for x, y in zip(a, rollout(self.seed + 2), strict=False)):
            self.report.warnings.append("different seeds gave identical trajectories (fine for deterministic envs)")
        self.report.passed.append("reset(seed=s) is deterministic")

    def close(self) -> None:
        try:
            self.env.close()
        except Exception as e:
            self.fail("close", "close() to release the env without raising", f"{type(e).__name__}: {e}",
                      "make close() idempotent and free only what the env opened")
            return
        self.report.passed.append("close() works")


def check_env(env: gym.Env, steps: int = 300, seed: int = 0, target: str | None = None, close: bool = True) -> CheckReport:
    """Check an already-built env; see module docstring."""
    report = CheckReport(target or type(env).__name__)
    checker = _Checker(report, env, steps, seed)
    try:
        for check in (checker.spaces, checker.reset_and_step, checker.determinism):
            try:
                check()
            except _Stop:
                raise
            except Exception as e:
                name = {"spaces": "spaces", "reset_and_step": "reset/step", "determinism": "seeding"}[check.__name__]
                text, details = _split_error(e) if isinstance(e, PolarError) else (f"{type(e).__name__}: {e}", "")
                if isinstance(e, ProtocolError):  # a connector's reply broke the wire protocol
                    checker.fail(name, "connector replies as docs/connector-protocol.md specifies", text,
                                 "make the connector reply as documented there; the message names the reply and what broke",
                                 details=details)
                else:
                    checker.fail(name, "reset/step to follow the env contract", text,
                                 "change the env so the message above no longer applies", details=details)
                raise _Stop from None
    except _Stop:
        pass
    if close:
        checker.close()
    return report


def check_harness(harness_cfg: AnyHarnessConfig, config_dir: Path | None = None, steps: int = 300, seed: int = 0) -> CheckReport:
    """Build a ``gymnasium`` or ``custom`` harness from its config and check it."""
    from polar.harness import make_env

    target = harness_cfg.id if isinstance(harness_cfg, GymnasiumHarnessConfig) else _spec_name(harness_cfg)
    try:
        env = make_env(harness_cfg, config_dir=config_dir)
    except PolarError as e:
        report = CheckReport(target)
        text, details = _split_error(e)
        report.violations.append(Violation("construct", "the harness to start", text,
                                           "fix the harness config or the connector class named in the message", details))
        return report
    if isinstance(harness_cfg, CustomHarnessConfig) and harness_cfg.connector_spec.command:
        # named by the class it declared (hello ``name``, init ``class_name``), not by its launcher's command line
        target = getattr(env, "connector_name", None) or target
    return check_env(env, steps=steps, seed=seed, target=target)


def _spec_name(cfg: AnyHarnessConfig) -> str:
    """The harness's name before it runs: a connector's class, else its command line until it declares one."""
    if not isinstance(cfg, CustomHarnessConfig):
        return str(cfg.type)
    spec = cfg.connector_spec
    if spec.module:
        return f"{spec.module}:{spec.class_name}"
    from polar.harness.connector.process import command_label

    return command_label(spec.command or [])
