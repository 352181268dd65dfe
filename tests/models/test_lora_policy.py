"""LoRA policies: only adapters train, and the merged weights load into the serving model by name."""

import copy

import torch

from polar.algorithms.sft import sft_train
from polar.config.grpo import LoraConfig, SFTKwargs
from polar.inference.embedded import load_weights
from polar.inference.tiny import build_tiny
from polar.models.llm_policy import LLMPolicy, chat_to_sample


def test_lora_trains_adapters_and_exports_serving_weights():
    model, tok = build_tiny(0)
    serving = copy.deepcopy(model)
    policy = LLMPolicy(model, tok, lora=LoraConfig(r=4, alpha=8, target_modules=None))
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    demo = chat_to_sample([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], None, tok)
    losses = sft_train(policy, [demo] * 4, SFTKwargs(learning_rate=1e-2, epochs=5, batch_size=4))
    assert losses[-1] < losses[0]
    exported = policy.serving_state_dict()
    assert set(exported) == set(serving.state_dict())  # same names as the engine's model
    before = {k: v.clone() for k, v in serving.state_dict().items()}
    load_weights(serving, exported)
    changed = [k for k in before if not torch.equal(before[k], serving.state_dict()[k])]
    assert changed and all("proj" in k for k in changed)  # only adapted projections moved
