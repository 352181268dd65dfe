"""The critic over the LLM's hidden states (advantage: value_head): turns from the mask, advantages, the
config's refusals, the value head learning returns on the tiny model, and its checkpoint round trip."""

import pytest
import torch

from polar.algorithms.grpo import GRPOLearner
from polar.algorithms.llm_critic import (
    explained_variance,
    per_token,
    state_positions,
    turn_index,
    turns_per_row,
    value_advantages,
)
from polar.config.base import validate
from polar.config.grpo import GRPOKwargs, LoraConfig
from polar.errors import ConfigError
from polar.inference.tiny import build_tiny
from polar.models.llm_policy import LLMPolicy
from polar.types import TrajectorySample


def test_turns_are_runs_of_sampled_tokens_and_states_precede_them():
    mask = torch.tensor([[0, 0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 1, 0, 0]])
    rows, cols = state_positions(mask)
    assert rows.tolist() == [0, 0, 1] and cols.tolist() == [1, 4, 0]
    assert turns_per_row(mask) == [2, 1]
    assert turn_index(mask).tolist() == [[-1, -1, 0, 0, -1, 1, -1], [-1, 2, 2, 2, 2, -1, -1]]
    tok = per_token(torch.tensor([10.0, 20.0, 30.0]), mask)
    assert tok.tolist() == [[0, 0, 10, 10, 0, 20, 0], [0, 30, 30, 30, 30, 0, 0]]
    with pytest.raises(ValueError, match="position 0"):
        state_positions(torch.tensor([[1, 1, 0]]))


def test_advantage_is_return_minus_value_and_explained_variance():
    r, v = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.5, 0.5, 1.0])
    assert value_advantages(r, v, normalize_advantage=False).tolist() == [0.5, -0.5, 0.0]
    a = value_advantages(r, v)
    assert abs(float(a.mean())) < 1e-6 and abs(float(a.std()) - 1) < 1e-4
    assert explained_variance(r.clone(), r) == 1.0 and explained_variance(torch.zeros(3), r) == 0.0
    assert explained_variance(v, torch.ones(3)) != explained_variance(v, torch.ones(3))  # NaN: returns constant


@pytest.mark.parametrize("kwargs, field", [
    ({"group_size": 1}, "advantage: value_head"),
    ({"value_head": {}}, "set advantage: value_head"),
    ({"advantage": "value_head", "value_head": {"freeze_llm": True}, "lora": {}}, "drop lora"),
    ({"advantage": "value_head", "value_head": {"freeze_llm": True}, "kl_coef": 0.1}, "kl_coef: 0"),
])
def test_bad_combinations_are_config_errors_naming_the_fix(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        validate(GRPOKwargs, kwargs, source="run.yaml")


def test_group_of_one_is_allowed_with_the_value_head():
    kw = validate(GRPOKwargs, {"group_size": 1, "advantage": "value_head"})
    assert kw.group_size == 1 and kw.value_head is not None and kw.value_head.vf_coef == 0.1


def _samples() -> tuple[list[TrajectorySample], list[float]]:
    """Two-turn samples whose return is fixed by the prompt's first token (5: return 0, 6: return 1)."""
    g = torch.Generator().manual_seed(1)
    out, rets = [], []
    for i in range(8):
        prompt = [5 + (i % 2)] * 3 + torch.randint(10, 200, (3,), generator=g).tolist()
        ids = prompt + torch.randint(10, 200, (3,), generator=g).tolist() + [7, 8] + torch.randint(10, 200, (2,), generator=g).tolist()
        mask = [0] * 6 + [1] * 3 + [0] * 2 + [1] * 2
        out.append(TrajectorySample(f"s{i}", ids, mask, [-5.0] * len(ids), [0] * len(ids), [0] * len(ids), 0.0))
        rets.append(float(i % 2))
    return out, rets


def _learner(freeze: bool, lora: bool = False, lr: float = 1e-2) -> GRPOLearner:
    torch.manual_seed(0)
    model, tok = build_tiny(0)
    cfg = LoraConfig(r=4, alpha=8) if lora else None
    kw = GRPOKwargs(advantage="value_head", group_size=1, lora=cfg, micro_batch_size=3, learning_rate=1e-3,
                    value_head={"learning_rate": lr, "freeze_llm": freeze})
    return GRPOLearner(LLMPolicy(model, tok, cfg), kw)


def test_frozen_llm_value_head_learns_the_returns_and_only_the_head_moves():
    learner = _learner(freeze=True)
    before = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    samples, returns = _samples()
    first = learner.optimize(samples, returns=returns)
    for _ in range(30):
        last = learner.optimize(samples, returns=returns)
    assert first["turns"] == 16 and first["value_mean"] == 0.0  # the head starts at 0
    assert first["value_loss"] == pytest.approx(0.5) and last["value_loss"] < 0.05
    assert last["explained_variance"] > 0.8
    assert all(torch.equal(v, learner.policy.model.state_dict()[k]) for k, v in before.items())


def test_lora_policy_trains_with_the_critic_and_the_head_round_trips_a_checkpoint():
    learner = _learner(freeze=False, lora=True, lr=3e-3)
    samples, returns = _samples()
    stats = [learner.optimize(samples, returns=returns) for _ in range(4)]
    assert all("policy_loss" in s and "value_loss" in s for s in stats)
    assert stats[-1]["value_loss"] < stats[0]["value_loss"]
    state = learner.state_dict()
    assert "value_head" in state
    fresh = _learner(freeze=False, lora=True, lr=3e-3)
    fresh.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(fresh.value_head.state_dict().values(),
                                                 learner.value_head.state_dict().values(), strict=True))
    with pytest.raises(ConfigError, match="no value head"):
        fresh.load_state_dict({"optimizer": state["optimizer"]})
    serving = learner.policy.serving_state_dict()  # the engine's weights carry no head
    assert not any("value" in k for k in serving)
