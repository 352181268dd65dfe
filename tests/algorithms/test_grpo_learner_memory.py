"""The GRPO learner's memory and device: a reference model only for a KL term, never a second copy of
the base under LoRA, batches on the learner's device, bf16 autocast and gradient checkpointing."""

import copy
import logging
from types import SimpleNamespace

import pytest
import torch

from polar.algorithms.grpo import GRPOLearner, token_logprobs
from polar.config.grpo import GRPOKwargs, LoraConfig
from polar.inference.tiny import build_tiny
from polar.models.llm_policy import LLMPolicy, collate
from polar.trainers.agentic_run import policy_options
from polar.trainers.device import learner_device
from polar.types import TrajectorySample


def _samples(n: int = 4, length: int = 12) -> list[TrajectorySample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(3, 200, (length - i,), generator=g).tolist()
        k = len(ids)
        out.append(TrajectorySample(session_id=f"s{i}", token_ids=ids, loss_mask=[0] * 4 + [1] * (k - 4),
                                    logprobs=[-5.0] * k, policy_versions=[0] * k, call_indices=[0] * k, reward=1.0))
    return out


def _learner(kl_coef: float, lora: bool) -> GRPOLearner:
    model, tok = build_tiny(0)
    cfg = LoraConfig(r=4, alpha=8, target_modules=None) if lora else None
    return GRPOLearner(LLMPolicy(model, tok, cfg), GRPOKwargs(kl_coef=kl_coef, lora=cfg, micro_batch_size=2,
                                                             learning_rate=1e-5))


def _tensor_storage(learner: GRPOLearner) -> set[int]:
    """Every parameter and buffer storage the learner holds (its policy, and its reference if any)."""
    mods = [learner.policy.model] + ([learner.reference] if learner.reference is not None else [])
    return {t.data_ptr() for m in mods for t in [*m.parameters(), *m.buffers()]}


def test_no_reference_without_kl():
    for lora in (False, True):
        learner = _learner(0.0, lora)
        assert learner.reference is None and learner.reference_kind == "none"
        assert learner.reference_logprobs(collate(_samples(), 0)) is None


def test_lora_reference_is_the_base_with_adapters_off_not_a_copy():
    without = _learner(0.0, lora=True)
    with_kl = _learner(0.1, lora=True)
    assert with_kl.reference is None and with_kl.reference_kind == "adapters_off"
    # the same number of tensors: no second copy of the base model anywhere in the learner
    assert len(_tensor_storage(with_kl)) == len(_tensor_storage(without))


def test_full_fine_tune_reference_is_a_frozen_copy():
    learner = _learner(0.1, lora=False)
    assert learner.reference_kind == "frozen_copy" and learner.reference is not None
    assert not learner.reference.training
    assert all(not p.requires_grad for p in learner.reference.parameters())
    ref_ptrs = {p.data_ptr() for p in learner.reference.parameters()}
    assert ref_ptrs.isdisjoint(p.data_ptr() for p in learner.policy.model.parameters())
    before = [p.clone() for p in learner.reference.parameters()]
    learner.optimize(_samples(), [1.0, -1.0, 0.5, -0.5])
    assert all(torch.equal(a, b) for a, b in zip(before, learner.reference.parameters(), strict=True))


def test_lora_reference_logprobs_equal_a_true_copy_of_the_base():
    model, tok = build_tiny(0)
    base_copy = copy.deepcopy(model).eval()
    cfg = LoraConfig(r=4, alpha=8, target_modules=None)
    learner = GRPOLearner(LLMPolicy(model, tok, cfg), GRPOKwargs(kl_coef=0.1, lora=cfg, learning_rate=1e-2))
    samples = _samples()
    for _ in range(2):  # move the adapters, so policy and reference differ
        learner.optimize(samples, [1.0, -1.0, 0.5, -0.5])
    batch = collate(samples, 0)
    ref = learner.reference_logprobs(batch)
    with torch.no_grad():
        expected = token_logprobs(base_copy(input_ids=batch.token_ids, attention_mask=batch.attention_mask,
                                            use_cache=False).logits, batch.token_ids)
        policy_logp = token_logprobs(learner.policy.logits(batch), batch.token_ids)
    mask = batch.loss_mask.bool()
    assert (policy_logp - expected)[mask].abs().max() > 1e-4  # the adapters did change the policy
    torch.testing.assert_close(ref[mask], expected[mask], rtol=0, atol=1e-5)
    assert learner.policy.model.training  # switching the adapters off and on left the model as it was


def test_the_kl_alone_pulls_a_moved_policy_back_when_every_advantage_is_zero():
    """What a tied group kept at advantage 0 (``kl_coef > 0``) does: no surrogate gradient, and the k3 KL
    moves the adapters back toward the base, so a collapsed policy is not left where it is."""
    torch.manual_seed(0)  # the adapters' initialization
    model, tok = build_tiny(0)
    cfg = LoraConfig(r=4, alpha=8, target_modules=None)
    learner = GRPOLearner(LLMPolicy(model, tok, cfg), GRPOKwargs(kl_coef=1.0, lora=cfg, learning_rate=1e-2))
    samples = _samples()
    for _ in range(3):
        learner.optimize(samples, [1.0, -1.0, 0.5, -0.5])
    batch = collate(samples, 0)
    mask = batch.loss_mask.bool()

    def kl_to_base() -> float:
        with torch.no_grad():
            d = learner.reference_logprobs(batch) - token_logprobs(learner.policy.logits(batch), batch.token_ids)
        return float((torch.exp(d) - d - 1.0)[mask].mean())

    moved = kl_to_base()
    assert moved > 1e-4
    stats = [learner.optimize(samples, [0.0, 0.0, 0.0, 0.0]) for _ in range(5)]
    assert all(abs(s["policy_loss"]) < 1e-9 and s["kl"] > 0 for s in stats)
    assert kl_to_base() < 0.5 * moved


def test_learner_device_rule(caplog):
    assert learner_device(1, cuda_available=True) == torch.device("cuda")
    assert learner_device(2, cuda_available=True) == torch.device("cuda")
    assert learner_device(0, cuda_available=True) == torch.device("cpu")
    with caplog.at_level(logging.WARNING, logger="polar.trainers.device"):
        assert learner_device(0, cuda_available=False) == torch.device("cpu")
        assert not caplog.records  # asking for no GPU is not a fallback
        for _ in range(3):
            assert learner_device(7, cuda_available=False) == torch.device("cpu")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["distribution.num_gpus=7 but CUDA is not available here; the learner runs on CPU"]


def test_policy_options_follow_the_config():
    kw = GRPOKwargs(autocast="bf16", gradient_checkpointing=True)
    cfg = SimpleNamespace(policy=SimpleNamespace(kwargs=kw), distribution=SimpleNamespace(num_gpus=0))
    assert policy_options(cfg) == {"device": torch.device("cpu"), "autocast": "bf16", "gradient_checkpointing": True}


def test_bf16_autocast_and_gradient_checkpointing_train():
    samples, advs = _samples(), [1.0, -1.0, 0.5, -0.5]
    grads = {}
    for name, opts in {"plain": {}, "checkpointed": {"gradient_checkpointing": True},
                       "bf16": {"autocast": "bf16"}}.items():
        model, tok = build_tiny(0)
        policy = LLMPolicy(model, tok, device="cpu", **opts)
        on = getattr(policy.model, "is_activation_checkpointing", None)
        assert (policy.model.is_gradient_checkpointing if on is None else on) == (name == "checkpointed")
        assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in policy.model.parameters())
        learner = GRPOLearner(policy, GRPOKwargs(micro_batch_size=2, learning_rate=1e-5))
        stats = learner.optimize(samples, advs)
        assert all(torch.isfinite(torch.tensor(v)) for v in stats.values()), stats
        # the gradient of one more backward (update() already stepped; only compare like with like)
        policy.model.zero_grad()
        batch = collate(samples, 0)
        logits = policy.logits(batch)
        assert logits.dtype == torch.float32
        (token_logprobs(logits, batch.token_ids) * batch.loss_mask).sum().backward()
        grads[name] = torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])
    # checkpointing recomputes the same activations: the same gradient; bf16 is close but not identical
    torch.testing.assert_close(grads["checkpointed"], grads["plain"], rtol=1e-4, atol=1e-5)
    assert not torch.equal(grads["bf16"], grads["plain"])
    cos = torch.nn.functional.cosine_similarity(grads["bf16"], grads["plain"], dim=0)
    assert cos > 0.9


@pytest.mark.parametrize("lora", [False, True])
def test_batches_move_to_the_policy_device(lora):
    # the meta device stands in for "not where collate builds tensors": TokenBatch.to moves every field
    batch = collate(_samples(), 0).to(torch.device("meta"))
    assert all(getattr(batch, f).device.type == "meta"
               for f in ("token_ids", "attention_mask", "loss_mask", "old_logprobs"))


def test_a_micro_batch_too_large_for_memory_is_split_with_the_same_gradient(monkeypatch):
    """Long episodes at the default micro_batch_size can need more memory for their logits than the machine
    has; the learner splits such micro-batches (the loss is normalized over the whole batch), so the update
    is the same, only in smaller passes."""
    import random

    import polar.algorithms.grpo as grpo

    def updated(budget: float) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        monkeypatch.setattr(grpo, "memory_budget_bytes", lambda device: budget)
        learner = _learner(0.0, lora=False)
        random.seed(0)
        stats = learner.optimize(_samples(6), [1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
        return {k: v.detach().clone() for k, v in learner.policy.model.state_dict().items()}, stats

    whole, whole_stats = updated(float("inf"))
    split, split_stats = updated(1.0)  # no micro-batch of two fits: every one is split into single sequences
    assert "micro_batches_split" not in whole_stats and split_stats["micro_batches_split"] == 3
    assert all(torch.allclose(whole[k], split[k], atol=1e-6) for k in whole)
    assert any(not torch.equal(whole[k], _learner(0.0, lora=False).policy.model.state_dict()[k]) for k in whole)


def test_minibatches_are_sequential_optimizer_steps_on_slices_of_the_shuffled_batch():
    """``num_minibatches: 2`` is two optimizer steps per pass, each on half of the shuffled batch, normalized
    over its own tokens: the same weights as two one-mini-batch updates on those halves in that order."""
    import random

    samples, advs = _samples(6), [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]

    def learner(num_minibatches: int) -> GRPOLearner:
        model, tok = build_tiny(0)
        return GRPOLearner(LLMPolicy(model, tok, None), GRPOKwargs(micro_batch_size=8, learning_rate=1e-3,
                                                                   num_minibatches=num_minibatches))

    random.seed(0)
    order = list(range(6))
    random.shuffle(order)
    two = learner(2)
    random.seed(0)
    stats = two.optimize(samples, advs)
    assert stats["optimizer_steps"] == 2.0
    assert int(two.optimizer.state_dict()["state"][0]["step"]) == 2

    one = learner(1)
    for half in (order[:3], order[3:]):
        one.optimize([samples[i] for i in half], [advs[i] for i in half])
    a, b = two.policy.model.state_dict(), one.policy.model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    # and not the one-step update on the whole batch
    whole = learner(1)
    random.seed(0)
    whole.optimize(samples, advs)
    assert any(not torch.allclose(a[k], whole.policy.model.state_dict()[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("lora", [False, True])
def test_lm_head_only_at_trained_positions_gives_the_full_logits_logprobs_and_gradient(lora, monkeypatch):
    """``token_logprobs`` runs the LM head only where a trained token is predicted (``logits_to_keep``); at the
    trained positions it equals the log-softmax of the full logits, and so does its gradient."""
    import polar.models.llm_policy as llm_policy

    def logprobs_and_grads(full: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        monkeypatch.setattr(llm_policy, "_keeps_logit_mask", (lambda model: False) if full else keeps)
        model, tok = build_tiny(0)
        cfg = LoraConfig(r=4, alpha=8, target_modules=None) if lora else None
        torch.manual_seed(0)  # the same LoRA initialisation both times
        policy = LLMPolicy(model, tok, cfg)
        batch = policy.collate(_samples(5, 14))
        logp = policy.token_logprobs(batch)
        (logp * batch.loss_mask).sum().backward()
        return logp.detach(), [p.grad.clone() for p in policy.parameters()]

    keeps = llm_policy._keeps_logit_mask
    model, tok = build_tiny(0)
    assert keeps(LLMPolicy(model, tok, None).model)  # the tiny Qwen2 takes a logits_to_keep mask
    kept, kept_grads = logprobs_and_grads(full=False)
    full, full_grads = logprobs_and_grads(full=True)
    mask = collate(_samples(5, 14), 0).loss_mask.bool()
    assert torch.allclose(kept[mask], full[mask], atol=1e-5)
    assert (kept[~mask] == 0).all() and (full[~mask] == 0).all()
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(kept_grads, full_grads, strict=True))
    # and both are the old full-logits computation
    model, tok = build_tiny(0)
    policy = LLMPolicy(model, tok, LoraConfig(r=4, alpha=8, target_modules=None) if lora else None)
    batch = policy.collate(_samples(5, 14))
    with torch.no_grad():
        reference = token_logprobs(policy.logits(batch), batch.token_ids)
    assert torch.allclose(kept[mask], reference[mask], atol=1e-5)


def test_logit_positions_count_trained_tokens_only():
    model, tok = build_tiny(0)
    policy = LLMPolicy(model, tok, None)
    samples = _samples(3, 12)  # lengths 12, 11, 10; the first 4 tokens of each are prompt
    assert policy.logit_positions(samples) == 8 + 7 + 6


def test_a_resumed_full_fine_tune_keeps_the_reference_its_first_step_took():
    """The frozen reference is the policy the first GRPO step starts from: after an SFT warm-up, the warmed-up
    weights. A resumed run builds its learner from the base model again, so the reference must come back from
    the checkpoint, or the KL term pulls the resumed run toward the base instead."""
    from polar.types import Batch

    learner = _learner(0.1, lora=False)
    with torch.no_grad():  # an SFT warm-up stage moved the policy
        for p in learner.policy.model.parameters():
            p.add_(0.01)
    learner.update(Batch(data=[], env_steps=0, iteration=1))  # the first GRPO step: the reference is taken here
    warmed = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    state = learner.state_dict()

    resumed = _learner(0.1, lora=False)  # built from the base model, as a resumed run's learner is
    resumed.load_state_dict(state)
    ref = resumed.reference.state_dict()
    assert all(torch.equal(ref[k], warmed[k]) for k in warmed)
    base = _learner(0.1, lora=False).policy.model.state_dict()
    assert not all(torch.equal(ref[k], base[k]) for k in base)
