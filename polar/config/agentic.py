"""Sections for agentic runs: ``tasks``, ``verifier``, ``model``, ``trajectory``, ``sessions``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from polar.config.base import StrictModel, did_you_mean

VERIFIER_TYPES = ("exact_match", "numeric", "regex", "python_tests", "workspace", "none",
                  "env_return", "humaneval", "reasoning_gym", "lm_eval", "llm_judge")


class VerifierConfig(StrictModel):
    """How a finished session becomes a reward: a built-in ``type`` or a user ``module:function``."""

    type: str = "exact_match"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(60.0, gt=0)
    reward_range: tuple[float, float] | None = Field(
        None, description="the rewards the verifier may return, e.g. [0, 1] when its reward is a success rate: a "
        "session whose reward is outside ends ERROR with a line naming the task (NaN always does)")
    trusted_workspace: bool = Field(
        False, description="a verifier that runs the workspace's code (python_tests, humaneval, swe_grader, ...) "
        "runs it in bubblewrap, and refuses where bubblewrap cannot work; true lets it run the code unisolated "
        "on this host there. Only for workspaces you wrote yourself: a model's code could change its own reward")

    @field_validator("reward_range")
    @classmethod
    def _ordered(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not v[0] <= v[1]:
            raise ValueError(f"reward_range [{v[0]:g}, {v[1]:g}]: the low end is above the high end; write [low, high]")
        return v

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        if v in VERIFIER_TYPES or ":" in v:
            return v
        raise ValueError(
            f"unknown verifier {v!r}{did_you_mean(v, list(VERIFIER_TYPES))}; use one of "
            f"{', '.join(VERIFIER_TYPES)} or 'module:function'"
        )


class ModelConfig(StrictModel):
    name_or_path: str = Field("tiny", description="a preset (tiny, smollm2-135m), a local HF folder, 'vllm:URL[,URL]' or 'sglang:URL[,URL]'")
    chat_template: str | None = Field(
        None, description="'model', 'hermes-tools' or a Jinja file; default: the model's own when it renders "
        "tools, else hermes-tools (ChatML models)")
    engine: Literal["embedded", "vllm", "openai_compat"] = Field(
        "embedded", description="embedded: in polar's process; vllm: polar launches and supervises vLLM servers; "
        "openai_compat: a chat endpoint (/v1/chat/completions) at base_url, for evaluation, generation and judges"
    )
    replicas: int = Field(1, ge=1, description="engine: vllm: how many vLLM servers to launch")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="engine: vllm: launcher options (max_model_len, kv_cache_space_gib, ...); "
        "openai_compat: timeout_s, max_retries, token_ids, context_length, ... (docs/inference.md)"
    )
    base_url: str | None = Field(None, description="engine: openai_compat: the endpoint, up to /v1")
    model: str | None = Field(None, description="engine: openai_compat: the model name the endpoint serves")
    api_key_env: str | None = Field(
        None, description="engine: openai_compat: the environment variable holding the API key (never the key)")
    tokenizer: str | None = Field(
        None, description="engine: openai_compat: the local tokenizer records are written in (default: "
        "name_or_path): the student's, for polar generate")

    @model_validator(mode="after")
    def _openai_compat(self) -> ModelConfig:
        compat_only = [k for k in ("base_url", "model", "api_key_env", "tokenizer") if getattr(self, k) is not None]
        if self.engine != "openai_compat" and compat_only:
            raise ValueError(f"model.{compat_only[0]} is for engine: openai_compat only (engine is {self.engine!r})")
        if self.engine == "openai_compat":
            missing = [k for k in ("base_url", "model") if not getattr(self, k)]
            if missing:
                raise ValueError(f"engine: openai_compat needs model.{missing[0]} (e.g. model: {{engine: openai_compat, "
                                 "base_url: http://127.0.0.1:8000/v1, model: NAME, api_key_env: OPENAI_API_KEY}})")
        return self

    def openai_compat_options(self) -> dict[str, Any]:
        """``load_engine`` keyword arguments of ``engine: openai_compat``."""
        return {"base_url": self.base_url, "api_key_env": self.api_key_env,
                "tokenizer": self.tokenizer or self.name_or_path, **self.engine_kwargs}


class TrajectoryConfig(StrictModel):
    builder: Literal["per_request", "prefix_merging"] = "prefix_merging"


class SessionsConfig(StrictModel):
    """The session pipeline: one worker pool per stage, a budget per session."""

    max_init_workers: int = Field(8, ge=1)
    max_run_workers: int | None = Field(
        None, ge=1, description="sessions running at once; null: 8 for a harness that starts a program per session "
        "(command or preset), 32 otherwise (an in-process callable or the built-in LLM agent waits on its model "
        "calls, so the engine's batch is what bounds it: the embedded engine batches 32)")
    max_postrun_workers: int = Field(4, ge=1)
    session_budget_s: float = Field(900.0, gt=0, description="INIT+RUN+POST_RUN wall time per session")
    workspace_root: str | None = Field(None, description="where session workspaces go (default: run dir)")
    keep_workspaces: bool = False
    max_node_retries: int = Field(2, ge=0, description="re-dispatches of a session whose gateway node was lost")
    node_wait_s: float = Field(60.0, gt=0, description="wait this long for a healthy gateway node, then ERROR")
