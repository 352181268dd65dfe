"""LoRA adapters as a sync payload (no vLLM needed): what the learner sends, and the start-time refusal of an
upstream that cannot load adapters. The real-vLLM path is tests/inference/test_vllm_lora.py."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from polar.config.grpo import LoraConfig
from polar.config.sync import WeightSyncConfig
from polar.inference import EngineError, load_engine
from polar.inference.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraAdapter, write_adapter_folder
from polar.models.llm_policy import LLMPolicy
from polar.testing.standin import FixedEngine, StandinServer, make_app


def _trained_policy(tiny_pair, seed: int = 0) -> LLMPolicy:
    model, tok = tiny_pair
    policy = LLMPolicy(copy.deepcopy(model), tok, LoraConfig(r=4, alpha=8.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return policy


def test_adapter_payload_is_the_adapters_only_and_adds_up_to_the_merged_weights(tiny_pair, tmp_path):
    policy = _trained_policy(tiny_pair)
    merged = policy.serving_state_dict()  # what a LoRA run sent before: the merged model
    policy.sync_adapters = True
    adapter = policy.serving_state_dict()
    assert isinstance(adapter, LoraAdapter) and adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert adapter.rank == 4 and adapter.scaling == 2.0
    assert adapter.nbytes < 0.5 * sum(t.numel() * t.element_size() for t in merged.values())
    base = {k: v for k, v in tiny_pair[0].state_dict().items()}
    deltas = adapter.deltas()
    assert deltas and set(deltas) <= set(base)
    for name, delta in deltas.items():  # base + scaling * B @ A is exactly peft's merge
        torch.testing.assert_close(base[name] + delta, merged[name], rtol=0, atol=1e-6)
    again = pickle.loads(pickle.dumps(adapter))  # Ray and the session service pickle it
    assert isinstance(again, LoraAdapter) and again.config == adapter.config and again.keys() == adapter.keys()
    folder = write_adapter_folder(adapter, tmp_path, 3)
    assert folder.name == "lora-v000003" and (folder / ADAPTER_WEIGHTS).is_file()
    assert '"r": 4' in (folder / ADAPTER_CONFIG).read_text()


def test_lora_sync_to_an_upstream_without_lora_support_fails_at_start_naming_the_key():
    with StandinServer(make_app(FixedEngine(), "vllm")) as server:
        up = load_engine(f"vllm:{server.url}")
        with pytest.raises(EngineError) as err:
            up.prepare_lora_sync(16)
        msg = str(err.value)
        assert msg.startswith("gateway.sync.lora: a LoRA run (rank 16) syncs adapters only, but vLLM replica")
        assert "--enable-lora" in msg and "gateway.sync.lora: merged" in msg and "\n" not in msg
        up.configure_sync(WeightSyncConfig(lora="merged"))
        assert up.prepare_lora_sync(16) is False  # merged weights, as a full fine-tune: no adapter routes needed


def test_check_model_with_the_adapter_scores_like_the_merged_weights(tiny_pair, tmp_path):
    """The logprob check holds the base weights plus the adapter (peft layers, adapter tensors copied in):
    it must score exactly like a model holding the merged weights, and like the base again once unloaded."""
    from polar.inference.weight_sync import LogprobCheck

    model, tok = tiny_pair
    model.save_pretrained(tmp_path)
    policy = _trained_policy(tiny_pair, seed=3)
    merged = policy.serving_state_dict()
    policy.sync_adapters = True
    adapter = policy.serving_state_dict()
    with_adapter = LogprobCheck(tmp_path, tok, "hi there", 8, 0.3)
    with_adapter.load_adapter(adapter)
    with_merged = LogprobCheck(tmp_path, tok, "hi there", 8, 0.3)
    with_merged.load(merged)
    base = LogprobCheck(tmp_path, tok, "hi there", 8, 0.3)
    ids = [3, 5, 7, 11, 13]
    torch.testing.assert_close(torch.tensor(with_adapter.reference(ids)), torch.tensor(with_merged.reference(ids)),
                               rtol=0, atol=1e-4)
    assert max(abs(a - b) for a, b in zip(with_adapter.reference(ids), base.reference(ids), strict=True)) > 1e-3
    with_adapter.load_adapter(None)
    assert with_adapter.reference(ids) == base.reference(ids)
