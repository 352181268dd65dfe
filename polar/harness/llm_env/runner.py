"""An LLM as the policy of a reset/step env: one episode per gateway session.

Per session the runner makes a fresh env, resets it with the task's ``seed``, and at every step writes
the observation as a chat turn, calls the model through the gateway with the official ``openai`` SDK
(so every call is recorded token-faithfully under the session's key), parses the answer into an action
and steps the env. With the whole episode in the prompt (``history_turns: null``) each call extends the
last, so ``prefix_merging`` makes the episode one trajectory sample and GRPO trains on its return.

An answer that does not parse gets up to ``repair_retries`` re-asks naming what was wrong; after that the
step counts as an ``invalid_action`` (with ``invalid_action_penalty``) and is skipped or ends the episode.
An action that parses but that the env refuses (a move its rules forbid) is the env's to report: it steps,
and puts the reason in ``info["polar/invalid_action"]``; the step then counts as an ``invalid_action`` too
(reason and penalty recorded), and the episode goes on or ends as the env says.
An observation that cannot be written as text, a failed model call or an env that raises ends the
session as ERROR with the reason. The outcome's ``details`` carry the episode's numbers, which the
``env_return`` verifier turns into the session reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polar.config.harness import CustomHarnessConfig, GymnasiumHarnessConfig
from polar.config.llm_agent import LLMAgentConfig
from polar.errors import ConfigError, HarnessError
from polar.harness.agent.runners import (
    HarnessOutcome,
    HarnessRunner,
    SessionContext,
    import_callable,
    wait_or_cancel,
)
from polar.harness.llm_env.agent import (
    ActionCodec,
    InvalidAction,
    ObservationError,
    act_tool,
    answer_value,
    format_hint,
    observation_text,
    system_prompt,
    window,
)
from polar.harness.llm_env.text_envs import TextRenderer, renderer_for
from polar.harness.llm_env.universal import Translator, build_translator, parse_universal

if TYPE_CHECKING:
    from polar.config.run import AnyHarnessConfig

log = logging.getLogger(__name__)

REFUSED_KEY = "polar/invalid_action"  # info key: the env refused the action it was given, and why

GENERIC_GOAL = "You control an agent in an environment. Choose actions that earn as much reward as possible."


def _anchor(observation_text: str) -> str:
    """A turn's anchor state (``policy.kwargs.step_advantage``): a digest of the observation it acted from,
    so turns that saw the same env state compare, whatever the history or the notes around it."""
    return hashlib.sha1(observation_text.encode()).hexdigest()[:16]


class _EpisodeError(Exception):
    """Ends the episode as a session ERROR with this reason."""


class LLMEnvRunner(HarnessRunner):
    """``harness: {type: gymnasium | custom}`` + ``agent: {type: llm}``: one env episode per session."""

    def __init__(self, harness_cfg: GymnasiumHarnessConfig | CustomHarnessConfig, agent_cfg: LLMAgentConfig,
                 config_dir: Path | None = None) -> None:
        self.harness_cfg, self.cfg, self.config_dir = harness_cfg, agent_cfg, config_dir
        env_id = getattr(harness_cfg, "id", None)
        self.renderer: TextRenderer | None = renderer_for(env_id) if agent_cfg.observation == "auto" else None
        if agent_cfg.random_map and not (env_id or "").startswith("FrozenLake"):
            raise ConfigError(f"agent.random_map is for FrozenLake, but harness.id is {env_id!r}; remove it")
        self.image_to_text = import_callable(agent_cfg.image_to_text, config_dir) if agent_cfg.image_to_text else None
        self.shaping = import_callable(agent_cfg.reward.function, config_dir) if agent_cfg.reward.function else None
        self.goal = agent_cfg.goal or (self.renderer.goal if self.renderer else GENERIC_GOAL)
        self.names = agent_cfg.actions or (list(self.renderer.actions) if self.renderer else None)
        spec = agent_cfg.translator
        self.translator_factory = import_callable(spec, config_dir) if spec and ":" in spec else None
        if harness_cfg.type == "gymnasium":  # a space the agent cannot describe fails now, not in every session
            env = self._make_env(0)
            try:
                self._codec(env.action_space)
            except HarnessError as e:
                raise ConfigError(f"agent.type llm on {env_id}: {e}") from None
            finally:
                env.close()

    def _codec(self, space: Any) -> ActionCodec | Translator:
        """What turns an answer into an env action: the space's codec, or the universal-action translator."""
        if self.cfg.action_format == "universal":
            return build_translator(self.cfg.translator, space, self.names, self.cfg.translator_kwargs,
                                    self.translator_factory)
        return ActionCodec(space, self.names)

    def _decode(self, codec: ActionCodec | Translator, msg: Any) -> Any:
        """The env action in the answer ``msg``, or :class:`InvalidAction` with the reason."""
        if isinstance(codec, ActionCodec):
            return codec.decode(answer_value(self.cfg.action_format, msg.content, msg.tool_calls, self.cfg.action_regex))
        return codec.translate(parse_universal(msg.content))

    # ---- env -------------------------------------------------------------------------------------------

    def _make_env(self, seed: int) -> Any:
        from polar.harness import make_env

        h = self.harness_cfg
        if self.cfg.random_map and isinstance(h, GymnasiumHarnessConfig):  # __init__ refused it on other harnesses
            from gymnasium.envs.toy_text.frozen_lake import generate_random_map

            kwargs = dict(h.kwargs)
            size = int(str(kwargs.pop("map_name", "4x4")).split("x")[0])
            kwargs["desc"] = generate_random_map(size=size, seed=seed)
            h = h.model_copy(update={"kwargs": kwargs})
        return make_env(h, self.config_dir)

    def _observe(self, env: Any, obs: Any) -> str:
        if self.renderer is not None:
            return self.renderer.render(env.unwrapped, obs)
        return observation_text(obs, env.observation_space, self.cfg.observation, self.image_to_text, env.render)

    def _success(self, terminated: bool, reward: float, info: dict[str, Any]) -> bool:
        if "is_success" in info:
            return bool(info["is_success"])
        if self.renderer is not None:
            return bool(self.renderer.success(terminated, reward, info))
        return bool(terminated and reward > 0)

    # ---- the session -----------------------------------------------------------------------------------

    async def run(self, ctx: SessionContext, timeout_s: float, cancel: asyncio.Event) -> HarnessOutcome:
        timeout_s = min(timeout_s, self.cfg.timeout_s)
        stats: dict[str, Any] = {}
        job = asyncio.ensure_future(self._episode(ctx, stats))
        ended = await wait_or_cancel(job, timeout_s, cancel)
        if ended != "done":
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job
            so_far = {k: stats[k] for k in ("steps", "calls", "invalid_actions", "parse_failures", "env_return")
                      if k in stats}
            return HarnessOutcome(timed_out=ended == "timeout", cancelled=ended == "cancelled", details=stats,
                                  stderr_tail=f"episode stopped after {json.dumps(so_far)}")
        try:
            job.result()
        except _EpisodeError as e:
            return HarnessOutcome(error=str(e), details=stats)
        except Exception as e:  # the episode's failure is data, not a crash
            log.debug("LLM env episode failed", exc_info=True)
            return HarnessOutcome(error=f"LLM env episode failed: {type(e).__name__}: {e}", details=stats)
        return HarnessOutcome(output=json.dumps({k: stats[k] for k in ("episode_return", "success", "steps",
                                                                       "invalid_actions")}),
                              returncode=0, details=stats)

    async def _episode(self, ctx: SessionContext, stats: dict[str, Any]) -> None:
        from openai import APIError, AsyncOpenAI

        cfg = self.cfg
        seed = ctx.task.get("seed")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise _EpisodeError(f"task {ctx.task.get('id', '?')!r} has no integer 'seed' (LLM env tasks are env "
                                "seeds: tasks: {source: seeds, start: 0, count: N})")
        stats.update(seed=seed, steps=0, calls=0, invalid_actions=0, parse_failures=0, repaired=0,
                     env_return=0.0, episode_return=0.0, success=False, terminated=False, truncated=False,
                     invalid_reasons=[], actions=[], turns=[])
        try:
            env = await asyncio.to_thread(self._make_env, seed)
        except Exception as e:
            raise _EpisodeError(f"could not make the env for seed {seed}: {type(e).__name__}: {e}") from None
        client = AsyncOpenAI(base_url=ctx.openai_base_url, api_key=ctx.api_key, max_retries=0, timeout=cfg.timeout_s)
        try:
            try:
                codec = self._codec(env.action_space)
            except HarnessError as e:
                raise _EpisodeError(str(e)) from None
            system = cfg.system_prompt or system_prompt(self.goal, codec, cfg.action_format, cfg.action_regex)
            tools = [act_tool(codec)] if isinstance(codec, ActionCodec) and cfg.action_format == "function_call" else None
            try:
                obs, info = await asyncio.to_thread(env.reset, seed=seed)
            except Exception as e:
                raise _EpisodeError(f"env.reset(seed={seed}) raised {type(e).__name__}: {e}") from None
            steps: list[list[dict[str, Any]]] = []
            note = ""
            reward = 0.0
            for t in range(cfg.max_steps):
                try:
                    text = self._observe(env, obs)
                except ObservationError as e:
                    raise _EpisodeError(f"observation at step {t} cannot be rendered: {e}") from None
                except Exception as e:
                    raise _EpisodeError(f"observation at step {t} cannot be rendered: {type(e).__name__}: {e}") from None
                steps.append(self._turn(steps, f"{note}Step {t + 1}.\n{text}\nWhat is your next action?"))
                first_call = stats["calls"]
                action, reason = await self._ask(client, ctx, system, tools, codec, steps, stats)
                turn: dict[str, Any] = {"state": _anchor(text), "calls": [first_call, stats["calls"]], "reward": 0.0}
                stats["turns"].append(turn)
                if action is None:
                    turn["reward"] = cfg.invalid_action_penalty
                    stats["invalid_actions"] += 1
                    if len(stats["invalid_reasons"]) < 5:
                        stats["invalid_reasons"].append(f"step {t + 1}: {reason}")
                    stats["episode_return"] += cfg.invalid_action_penalty
                    stats["steps"] += 1
                    note = "Your last answer was not a valid action, so nothing happened.\n"
                    if cfg.on_invalid == "end":
                        stats["truncated"] = True
                        break
                    continue
                try:
                    nobs, reward, terminated, truncated, info = await asyncio.to_thread(env.step, action)
                except Exception as e:
                    raise _EpisodeError(f"env.step({action!r}) at step {t + 1} raised {type(e).__name__}: {e}") from None
                reward = float(reward)
                shaped = cfg.reward.scale * reward + cfg.reward.step_penalty
                if self.shaping is not None:
                    extra = self.shaping(obs=obs, action=action, reward=reward, next_obs=nobs, terminated=terminated,
                                         info=info)
                    shaped += float(await extra if inspect.isawaitable(extra) else extra)
                stats["steps"] += 1
                stats["actions"].append(action.tolist() if hasattr(action, "tolist") else action)
                stats["env_return"] += reward
                stats["episode_return"] += shaped
                turn["reward"] = shaped
                obs = nobs
                note = f"Reward: {reward:g}.\n" if reward else ""
                refused = info.get(REFUSED_KEY) if isinstance(info, dict) else None
                if refused:  # the env's own verdict; its next observation tells the model
                    stats["invalid_actions"] += 1
                    if len(stats["invalid_reasons"]) < 5:
                        stats["invalid_reasons"].append(f"step {t + 1}: the env refused {action!r}: {refused}")
                    stats["episode_return"] += cfg.invalid_action_penalty
                    turn["reward"] += cfg.invalid_action_penalty
                if terminated or truncated:
                    stats["terminated"], stats["truncated"] = bool(terminated), bool(truncated)
                    stats["success"] = self._success(bool(terminated), reward, info)
                    break
            else:
                stats["truncated"] = True
            if stats["success"]:
                stats["episode_return"] += cfg.reward.success_bonus
                stats["turns"][-1]["reward"] += cfg.reward.success_bonus
            stats["episode_return"] = round(stats["episode_return"], 6)
        except APIError as e:
            raise _EpisodeError(f"model call {stats['calls']} failed: {type(e).__name__}: {e}") from None
        finally:
            await client.close()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(env.close)

    def _turn(self, steps: list[list[dict[str, Any]]], text: str) -> list[dict[str, Any]]:
        """The new observation: a tool result after an ``act`` call, else a user message."""
        last = steps[-1][-1] if steps else None
        if last is not None and last.get("tool_calls"):
            return [{"role": "tool", "tool_call_id": last["tool_calls"][0]["id"], "content": text}]
        return [{"role": "user", "content": text}]

    async def _ask(self, client: Any, ctx: SessionContext, system: str, tools: Any, codec: ActionCodec | Translator,
                   steps: list[list[dict[str, Any]]], stats: dict[str, Any]) -> tuple[Any, str]:
        """One action: a call, plus up to ``repair_retries`` re-asks; ``(None, reason)`` when none parses."""
        cfg = self.cfg
        reason = ""
        for attempt in range(cfg.repair_retries + 1):
            kwargs: dict[str, Any] = {"tools": tools} if tools else {}
            resp = await client.chat.completions.create(
                model=ctx.model, messages=window(system, steps, cfg.history_turns), max_tokens=cfg.max_tokens,
                temperature=cfg.temperature, **kwargs)
            stats["calls"] += 1
            msg = resp.choices[0].message
            reply: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
            if msg.tool_calls:
                reply["tool_calls"] = [tc.model_dump(include={"id", "type", "function"}) for tc in msg.tool_calls]
            steps[-1].append(reply)
            try:
                action = self._decode(codec, msg)
            except InvalidAction as e:
                reason = str(e)
                stats["parse_failures"] += 1
                if attempt < cfg.repair_retries:
                    fix = f"That is not a valid action: {reason}. {format_hint(cfg.action_format, codec, cfg.action_regex)}"
                    if reply.get("tool_calls"):
                        steps[-1].append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": fix})
                    else:
                        steps[-1].append({"role": "user", "content": fix})
                continue
            stats["repaired"] += attempt > 0
            if reply.get("tool_calls") and not tools:
                reply.pop("tool_calls")
            return action, ""
        return None, reason


def env_return_verdict(harness: dict[str, Any]) -> dict[str, Any]:
    """Verifier ``env_return`` (LLM env runs): the session reward is the shaped episode return the runner
    reported; nothing else to judge."""
    if "episode_return" not in harness:
        raise HarnessError("verifier env_return needs an LLM env harness (agent.type: llm), whose outcome carries "
                           "the episode return; this harness reported none")
    keep = ("success", "env_return", "steps", "calls", "invalid_actions", "parse_failures", "repaired",
            "terminated", "truncated", "invalid_reasons", "seed", "actions", "turns")
    return {"reward": float(harness["episode_return"]), **{k: harness[k] for k in keep if k in harness}}


def build_llm_env_runner(harness_cfg: AnyHarnessConfig, agent_cfg: LLMAgentConfig,
                         config_dir: Path | None = None) -> LLMEnvRunner:
    """The session runner for an env harness whose agent is ``{type: llm}``."""
    if not isinstance(harness_cfg, (GymnasiumHarnessConfig, CustomHarnessConfig)):
        raise ConfigError(f"agent.type llm drives an env harness (gymnasium or custom), not harness.type "
                          f"{harness_cfg.type!r}; agent harnesses bring their own agent")
    return LLMEnvRunner(harness_cfg, agent_cfg, config_dir)
