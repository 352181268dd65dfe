"""GRPO and SFT hyperparameters for LLM policies (``policy: {type: grpo|sft, kwargs: {...}}``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from polar.config.base import StrictModel

# Chosen on SmolLM2-135M-Instruct (docs/agentic.md, "How the defaults were chosen"): LoRA at 4e-4 learnt the
# sums, chain_sum and FrozenLake benchmarks within 12-30 steps; full fine-tuning at 2e-5 is the rate the
# by-hand run in issue 11 learnt the sums with.
LEARNING_RATE_LORA = 4e-4
LEARNING_RATE_FULL = 2e-5
# The rollout's sampling when policy.kwargs sets none (an agent harness; the LLM agent's own are agent.*)
ROLLOUT_TEMPERATURE = 1.0
ROLLOUT_MAX_TOKENS = 64


class LoraConfig(StrictModel):
    """Low-rank adapters (peft). ``target_modules: null`` adapts every linear projection of the transformer
    blocks (attention and MLP), as the real-model benchmarks did."""

    r: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | None = None


class ValueHeadConfig(StrictModel):
    """The critic of ``advantage: value_head`` (``polar.algorithms.llm_critic``): V(turn) from the LLM's last
    hidden state just before each turn's first sampled token; the advantage is the session's return minus it.
    The head is the learner's alone: checkpointed with it, never sent to the engine."""

    hidden_units: int = Field(0, ge=0, description="0: a linear head; N: one hidden layer of N tanh units")
    learning_rate: float = Field(1e-4, gt=0, description="AdamW rate of the head (the LLM's is policy.kwargs.learning_rate)")
    vf_coef: float = Field(0.1, gt=0, description="weight of the value loss next to the policy loss")
    clip_range_vf: float | None = Field(
        None, gt=0, description="PPO's clipped value loss: the new value is clipped to the step's old value +- this")
    normalize_advantage: bool = Field(True, description="advantages to zero mean, unit std over the step's turns")
    freeze_llm: bool = Field(
        False, description="train the head only: the LLM (and so the served policy) stays as it is")


class StepAdvantageConfig(StrictModel):
    """GiGPO's step-level advantage (Feng et al., 2025, "Group-in-Group Policy Optimization for LLM Agent
    Training"; ``polar.algorithms.grpo.step_advantages``): the turns of a group's episodes that acted from
    the same observation (an *anchor state*) are compared by their discounted return-to-go, and each turn's
    advantage is the episode's group advantage plus ``weight`` x that step advantage. It gives per-turn
    credit without a critic: at a state where one move falls into a hole and another goes on, the two
    differ even when the episodes' returns tie. Needs sessions that report their turns (``agent.type: llm``)."""

    weight: float = Field(1.0, ge=0, description="omega: the step advantage's weight next to the episode's")
    gamma: float = Field(0.95, ge=0, le=1, description="discount of the step rewards in each turn's return-to-go")
    normalize: Literal["std", "none"] = Field(
        "std", description="std: (G - mean) / std over the anchor group (GiGPO's default); none: G - mean")


class DynamicSamplingConfig(StrictModel):
    """DAPO's dynamic sampling (Yu et al., 2025): a step keeps drawing groups until it has ``tasks_per_step``
    whose rewards differ (a tied group has advantage 0 everywhere and teaches the surrogate nothing), at most
    ``max_extra_rounds`` more rounds. A step whose first round has the signal costs nothing more."""

    max_extra_rounds: int = Field(
        3, ge=0, description="extra rounds of groups a step may draw to fill tasks_per_step groups with a signal "
                             "(0: off; one round as before)")


class DifficultyFilterConfig(StrictModel):
    """Online difficulty filtering over the tasks: a per-task pass-rate estimate (an exponential moving average
    of its groups' success), and the next tasks drawn among those whose estimate lies in ``[low, high]``, and
    the tasks never drawn yet. A task outside the band is still drawn with probability ``explore_share`` when
    its turn comes, so its estimate follows the policy. Checkpointed with the learner."""

    low: float = Field(0.05, ge=0, le=1, description="draw tasks whose pass-rate estimate is at least this")
    high: float = Field(0.95, ge=0, le=1, description="... and at most this")
    ema: float = Field(0.5, gt=0, le=1, description="weight of the newest group's success in the estimate")
    explore_share: float = Field(
        0.1, ge=0, le=1, description="chance that a task outside the band is drawn anyway when its turn comes")

    @model_validator(mode="after")
    def _a_band(self) -> DifficultyFilterConfig:
        if self.low > self.high:
            raise ValueError(f"difficulty_filter: low {self.low:g} is above high {self.high:g}; the band is [low, high]")
        return self


class TeacherConfig(StrictModel):
    """On-policy distillation's teacher: a model that scores the student's sampled tokens (its logprob of each,
    given everything before it, from one forward pass)."""

    name_or_path: str = Field(..., min_length=1, description="a preset (tiny, smollm2-135m), a local HF folder, or a "
                              "polar GRPO/SFT run (its folder: the latest checkpoint; or a checkpoint file), rebuilt "
                              "on its own base model with its LoRA merged; it must have the student's tokenizer "
                              "(nothing is downloaded)")


class PartialRolloutsConfig(StrictModel):
    """Partial rollouts (AReaL, Kimi k1.5, PipelineRL): sessions run on across weight updates instead of one
    batch at a time. The collector keeps groups in flight and hands each step the first ``tasks_per_step``
    that finish (oldest first); a weight update does not wait for or abort the calls under way, which go on
    under the new weights (``gateway.sync.in_flight: continue``), each token recording the version that
    sampled it. ``max_off_policy_steps`` (K) bounds the staleness per token: a group whose oldest token is
    more than K versions behind the learner is dropped, never trained on. The loss's importance ratio is
    taken per token against the logprob its own version recorded, so clipping and ``tis_cap`` apply per token."""

    max_groups_in_flight: int | None = Field(
        None, ge=1, description="groups submitted but not yet trained on, at most; null: tasks_per_step x "
        "(max_off_policy_steps + 1), the most that keeps groups that finish in order within K versions")


class GRPOKwargs(StrictModel):
    group_size: int = Field(
        8, ge=1, description="samples per task (one GRPO group); 1 only with advantage: value_head")
    tasks_per_step: int = Field(6, ge=1, description="groups collected per optimizer step")
    total_steps: int = Field(20, ge=1, description="optimizer steps (each: collect, learn, sync weights)")
    learning_rate: float | None = Field(
        None, gt=0, description=f"AdamW learning rate; null: {LEARNING_RATE_LORA:g} with lora, {LEARNING_RATE_FULL:g} without")
    kl_coef: float = Field(0.0, ge=0, description="weight of the k3 KL penalty to the reference model")
    clip_range: float = Field(0.2, gt=0, description="PPO-style clip of the importance ratio (low side)")
    clip_range_high: float | None = Field(None, gt=0, description="upper clip; defaults to clip_range")
    advantage: Literal["mean_std", "mean", "leave_one_out", "value_head"] = Field(
        "mean_std", description="the baseline: the group's rewards (mean_std: (r - mean) / std; mean: r - mean, "
                                "Dr.GRPO; leave_one_out) or a learned critic (value_head)")
    loss_aggregation: Literal["token_mean", "dr_grpo", "gspo"] = Field(
        "token_mean", description="token_mean: the clipped loss summed over the tokens, divided by the mini-batch's "
        "tokens; dr_grpo: summed over each sequence's tokens, divided by the sequences (no length normalisation; "
        "with advantage mean_std the group advantage is r - mean, no std); gspo: one importance ratio per "
        "sequence (the geometric mean of its tokens'), clipped, averaged over the sequences")
    dynamic_sampling: DynamicSamplingConfig = Field(
        default_factory=DynamicSamplingConfig,
        description="DAPO: draw more groups until tasks_per_step of them have a signal (max_extra_rounds: 0 turns it off)")
    difficulty_filter: DifficultyFilterConfig | None = Field(
        None, description="draw tasks whose pass-rate estimate lies in a band, plus unseen ones (null: uniform)")
    overlong_filter: bool = Field(
        False, description="a session cut by max_tokens (its last call's finish_reason: length) or by its timeout "
                           "is left out of its group (not trained on, not in the baseline) instead of scored")
    value_head: ValueHeadConfig | None = Field(
        None, description="the critic of advantage: value_head (null there: the defaults)")
    step_advantage: StepAdvantageConfig | None = Field(
        None, description="GiGPO's per-turn credit for multi-step LLM env episodes (null: one advantage per episode)")
    tis_cap: float | None = Field(
        None, gt=0, description="truncated importance sampling: weight each token by min(exp(learner_lp - rollout_lp), tis_cap)")
    teacher: TeacherConfig | None = Field(
        None, description="on-policy distillation: each sampled token's advantage is log p_teacher(token) - "
                          "log p_student(token), the per-token reverse KL, instead of the group's reward (null: GRPO)")
    epochs_per_step: int = Field(1, ge=1, description="passes over each collected batch")
    num_minibatches: int = Field(
        1, ge=1, description="optimizer steps per pass: the shuffled batch is cut into this many mini-batches "
                             "(PPO's minibatches; more updates from the same samples at the same compute)")
    micro_batch_size: int = Field(8, ge=1, description="sequences per forward pass (gradient accumulation)")
    max_grad_norm: float = Field(1.0, gt=0)
    max_off_policy_steps: int = Field(
        1, ge=0, description="drop groups with a token sampled more than this many versions ago (K; 0: on-policy, "
                             "no overlap of collection and learning; 1: the next batch is collected while one trains)")
    partial_rollouts: PartialRolloutsConfig | None = Field(
        None, description="sessions run on across weight updates, each token tagged with its version, at most "
                          "max_off_policy_steps behind (null: one-step-off, a batch at a time)")
    temperature: float | None = Field(
        None, ge=0, description="the rollout's sampling temperature: replaces the one each model call asks for; "
                                f"null: {ROLLOUT_TEMPERATURE:g}, or agent.temperature with the built-in LLM agent")
    max_tokens: int | None = Field(
        None, ge=1, description="the most tokens one model call samples: caps what each call asks for; "
                                f"null: {ROLLOUT_MAX_TOKENS}, or agent.max_tokens with the built-in LLM agent")
    lora: LoraConfig | None = None
    autocast: Literal["bf16", "off"] = Field(
        "off", description="bf16: forward passes under torch.autocast(bfloat16) (the weights and optimizer stay fp32)")
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass (HF gradient_checkpointing_enable): less memory, more compute")
    eval_every: int = Field(0, ge=0, description="evaluate held-out tasks every N steps (0 = start and end only)")
    eval_samples: int = Field(1, ge=1, description="sessions per held-out task in each evaluation")

    @model_validator(mode="before")
    @classmethod
    def _partial_rollouts_switch(cls, data: Any) -> Any:
        """``partial_rollouts: true`` is ``{}`` (the defaults), ``false`` is off."""
        if isinstance(data, dict) and isinstance(data.get("partial_rollouts"), bool):
            data = {**data, "partial_rollouts": {} if data["partial_rollouts"] else None}
        return data

    @model_validator(mode="after")
    def _the_baseline(self) -> GRPOKwargs:
        if self.advantage == "value_head" and self.value_head is None:
            object.__setattr__(self, "value_head", ValueHeadConfig())
        if self.value_head is not None and self.advantage != "value_head":
            raise ValueError(f"value_head is set but advantage is {self.advantage!r}, which uses the group's rewards "
                             "as the baseline; set advantage: value_head to train the critic, or drop value_head")
        if self.step_advantage is not None and self.advantage == "value_head":
            raise ValueError("step_advantage compares turns within a group, and advantage: value_head has a critic "
                             "instead of the group; use one of them")
        if self.teacher is not None and (self.advantage == "value_head" or self.step_advantage is not None
                                         or self.loss_aggregation == "gspo"):
            raise ValueError("teacher gives every sampled token its own advantage (the reverse KL to the teacher), so "
                             "it replaces advantage: value_head, step_advantage and loss_aggregation gspo; drop those")
        if self.group_size < 2 and self.advantage != "value_head" and self.teacher is None:
            raise ValueError(f"group_size 1: advantage {self.advantage!r} compares the samples of one task, so it needs "
                             "group_size >= 2; or set advantage: value_head (a learned baseline needs no group)")
        if self.loss_aggregation == "gspo" and (self.step_advantage is not None or self.advantage == "value_head"):
            raise ValueError("loss_aggregation gspo takes one advantage per sequence; step_advantage and advantage: "
                             "value_head give one per turn. Use loss_aggregation token_mean or dr_grpo with them")
        cap = self.partial_rollouts.max_groups_in_flight if self.partial_rollouts is not None else None
        if cap is not None and cap < self.tasks_per_step:
            raise ValueError(f"partial_rollouts.max_groups_in_flight {cap} is below tasks_per_step {self.tasks_per_step}: "
                             "a step takes tasks_per_step groups that ran together; raise it, or leave it out")
        if self.partial_rollouts is not None and self.max_off_policy_steps < 1:
            raise ValueError("partial_rollouts: sessions span weight updates, so a token can be a version behind the "
                             "learner; set max_off_policy_steps >= 1 (it is 0), or drop partial_rollouts")
        if self.loss_aggregation == "gspo" and self.tis_cap is not None:
            raise ValueError("loss_aggregation gspo already weighs each sequence by its own ratio; drop tis_cap")
        if self.value_head is not None and self.value_head.freeze_llm:
            if self.lora is not None:
                raise ValueError("value_head.freeze_llm trains the value head only, so lora adapters would never "
                                 "train; drop lora, or set value_head.freeze_llm: false")
            if self.kl_coef > 0:
                raise ValueError("value_head.freeze_llm keeps the LLM at its reference, so kl_coef has nothing to "
                                 "penalize; set kl_coef: 0, or value_head.freeze_llm: false")
        return self

    @model_validator(mode="after")
    def _learning_rate_for_the_trained_weights(self) -> GRPOKwargs:
        if self.learning_rate is None:  # written into config.resolved.yaml, so a run records the rate it used
            object.__setattr__(self, "learning_rate", LEARNING_RATE_LORA if self.lora is not None else LEARNING_RATE_FULL)
        return self


class SFTKwargs(StrictModel):
    learning_rate: float = Field(1e-4, gt=0)
    epochs: int = Field(1, ge=1)
    max_steps: int = Field(0, ge=0, description="stop after this many optimizer steps (0 = run all epochs)")
    batch_size: int = Field(16, ge=1)
    max_grad_norm: float = Field(1.0, gt=0)
    lora: LoraConfig | None = None
    autocast: Literal["bf16", "off"] = Field("off", description="bf16: forward passes under torch.autocast(bfloat16)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass")


class SFTWarmupConfig(StrictModel):
    """Behaviour cloning before RL: ``demonstrations`` is a chat JSONL or a ``polar generate`` dataset."""

    demonstrations: str
    kwargs: SFTKwargs = Field(default_factory=SFTKwargs)
