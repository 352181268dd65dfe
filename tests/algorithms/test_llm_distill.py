"""On-policy distillation for LLM agents (``policy.kwargs.teacher`` on GRPO): the student samples, the teacher
scores each sampled token, and the per-token advantage is ``log p_teacher - log p_student`` (reverse KL)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from polar.algorithms.grpo import GRPOLearner
from polar.config.grpo import GRPOKwargs, TeacherConfig
from polar.inference.sampling import sequence_logprobs
from polar.inference.tiny import build_tiny
from polar.models.llm_policy import LLMPolicy
from polar.types import Batch, SessionResult, SessionStatus, TrajectorySample

PROMPT = [5, 9, 11, 13, 21]
TARGET = 731  # the answer the teacher is taught: the untrained student's 5th most likely (p 0.047) after PROMPT


def _teacher(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the tiny model taught (cross-entropy, small Adam steps) to answer TARGET after PROMPT, until it
    gives it 0.7: the student tilted to one answer, as a trained model is to its base."""
    teacher = copy.deepcopy(model).float().train()
    opt = torch.optim.Adam(teacher.parameters(), lr=1e-3)
    ids = torch.tensor([PROMPT])
    for _ in range(200):
        loss = -torch.log_softmax(teacher(input_ids=ids).logits[0, -1], -1)[TARGET]
        if float(loss.detach()) < -math.log(0.7):
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    return teacher.eval().requires_grad_(False)


def _next_token_logprobs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.tensor([PROMPT])).logits[0, -1].float(), -1)


def _sessions(policy: LLMPolicy, n: int, version: int, seed: int) -> list[SessionResult]:
    """``n`` one-token answers the student samples itself (as its engine would), with the logprobs it recorded."""
    logp = _next_token_logprobs(policy.model)
    draws = torch.multinomial(logp.exp(), n, replacement=True, generator=torch.Generator().manual_seed(seed))
    out = []
    for i, a in enumerate(draws.tolist()):
        k = len(PROMPT)
        sample = TrajectorySample(session_id=f"s{seed}-{i}", token_ids=[*PROMPT, a], loss_mask=[0] * k + [1],
                                  logprobs=[0.0] * k + [float(logp[a])], policy_versions=[version] * (k + 1),
                                  call_indices=[0] * (k + 1), metadata={"min_policy_version": version})
        out.append(SessionResult(session_id=sample.session_id, task_id="t", group_id=f"g{seed}", sample_index=i,
                                 status=SessionStatus.DONE, reward=0.0, samples=[sample]))
    return out


def _reverse_kl(student: torch.nn.Module, teacher: torch.nn.Module) -> float:
    s, t = _next_token_logprobs(student), _next_token_logprobs(teacher)
    return float((s.exp() * (s - t)).sum())


def test_on_policy_distillation_moves_the_student_to_the_teachers_answer():
    model, tok = build_tiny(0)
    teacher = _teacher(model)
    assert _next_token_logprobs(teacher)[TARGET].exp() >= 0.7  # the teacher strongly prefers TARGET
    policy = LLMPolicy(model, tok)
    learner = GRPOLearner(policy, GRPOKwargs(group_size=1, tasks_per_step=16, micro_batch_size=8, learning_rate=3e-3,
                                             teacher=TeacherConfig(name_or_path="unused-here")), teacher)
    p_before, kl_before = float(_next_token_logprobs(policy.model)[TARGET].exp()), _reverse_kl(policy.model, teacher)
    stats = {}
    for step in range(1, 7):
        groups = [_sessions(policy, 16, step - 1, seed=step)]
        stats = learner.update(Batch(data=groups, env_steps=16, episode_returns=[0.0] * 16, iteration=step,
                                     version=step - 1))
        assert stats["update_skipped"] == 0 and stats["samples"] == 16 and stats["teacher_tokens"] == 16
        # the teacher's logprob recorded for each sampled token is the teacher model's own (a direct forward pass)
        for r in groups[0]:
            s = r.samples[0]
            direct = sequence_logprobs(teacher, s.token_ids)[-1]
            assert s.metadata["teacher_logprobs"][-1] == pytest.approx(direct, abs=1e-5)
            assert s.metadata["teacher_logprobs"][:-1] == [0.0] * len(PROMPT)
    p_after, kl_after = float(_next_token_logprobs(policy.model)[TARGET].exp()), _reverse_kl(policy.model, teacher)
    assert p_before < 0.05 and p_after > 0.5 and int(_next_token_logprobs(policy.model).argmax()) == TARGET, (p_before, p_after)
    assert kl_after < 0.25 * kl_before, (kl_before, kl_after)
    assert stats["teacher_reverse_kl"] < kl_before  # the step's sampled estimate went down with it


def test_teacher_replaces_the_group_baselines_and_allows_groups_of_one():
    GRPOKwargs(group_size=1, teacher={"name_or_path": "tiny"})
    with pytest.raises(ValueError, match="teacher gives every sampled token its own advantage"):
        GRPOKwargs(teacher={"name_or_path": "tiny"}, advantage="value_head")
    with pytest.raises(ValueError, match="group_size 1"):
        GRPOKwargs(group_size=1)
