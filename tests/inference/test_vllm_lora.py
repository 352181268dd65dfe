"""LoRA adapter sync into a real vLLM CPU server launched by polar with ``engine_kwargs.max_lora_rank``.

A LoRA learner built on the launched engine sends its adapters only (``LoraAdapter``); each sync loads them
as ``polar-v<version>`` through vLLM's ``/v1/load_lora_adapter``, checks that name's logprobs against the
learner's, then routes the engine's calls to it and unloads names beyond ``sync.keep_adapters``. A load
vLLM rejects, or an adapter that fails the check, leaves the previous adapter and version serving.
One replica serves this module (its own: the shared ``launched_vllm`` has no LoRA support).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from polar.config.grpo import LoraConfig
from polar.config.sync import WeightSyncConfig
from polar.inference import GenerationRequest, collect
from polar.inference.lora import ADAPTER_WEIGHTS, LoraAdapter
from polar.inference.weight_sync import WeightSyncError
from polar.models.llm_policy import LLMPolicy

pytestmark = pytest.mark.vllm

RANK = 8


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def lora_vllm(vllm_model_folder, tmp_path_factory):
    from polar.errors import PolarError
    from polar.inference.vllm_launcher import launch_vllm

    try:
        engine = launch_vllm(str(vllm_model_folder), replicas=1, log_dir=tmp_path_factory.mktemp("vllm-lora-logs"),
                             enforce_eager=True, max_model_len=1024, max_lora_rank=RANK)
    except PolarError as exc:
        pytest.fail(f"{exc} (the real-vLLM tests need `make vllm`)", pytrace=False)
    engine.configure_sync(WeightSyncConfig(), tmp_path_factory.mktemp("lora-sync"))
    yield engine
    run(engine.close())


def _train_step(policy: LLMPolicy, seed: int) -> None:
    """Stands in for an optimizer step: new values in every adapter (lora_B starts at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))


def _greedy(engine, prompt):
    return run(collect(engine.generate(GenerationRequest(prompt, max_tokens=8, temperature=0.0, stream=False))))


def _served(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]


def _chat(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer.encode(rendered, add_special_tokens=False)


def test_lora_run_syncs_adapters_only_serves_the_new_one_checked_and_unloads_old(lora_vllm):
    engine = lora_vllm
    url = engine.fleet.urls[0]
    policy = LLMPolicy.from_engine(engine, LoraConfig(r=RANK))
    assert policy.sync_adapters
    prompt = _chat(engine.tokenizer, "Name three colours.")
    base = _greedy(engine, prompt)
    v0 = engine.policy_version
    full_bytes = sum(p.numel() * 4 for p in policy.model.get_base_model().parameters())
    outs = []
    for step in (1, 2, 3):
        _train_step(policy, seed=step)
        payload = policy.serving_state_dict()
        assert isinstance(payload, LoraAdapter) and all("lora_" in k for k in payload)
        run(engine.update_weights(payload, v0 + step))
        last = engine.last_sync
        assert last["adapter"] == f"polar-v{v0 + step}" and last["checks"][url]["ok"], last
        assert last["bytes"] < 0.1 * full_bytes  # adapters only, not the merged model
        out = _greedy(engine, prompt)
        assert out.policy_version == v0 + step
        outs.append(out)
    assert outs[0].logprobs != base.logprobs and outs[1].logprobs != outs[0].logprobs
    # keep_adapters: 2 -> the oldest name is unloaded from the server, the newest serves
    served = _served(url)
    assert f"polar-v{v0 + 3}" in served and f"polar-v{v0 + 2}" in served and f"polar-v{v0 + 1}" not in served
    assert engine.weight_sync.adapter == f"polar-v{v0 + 3}"
    assert len(list(engine.weight_sync.root.glob("lora-v*"))) == 2


def test_failed_adapter_load_or_check_keeps_the_old_adapter_and_version_serving(lora_vllm):
    engine = lora_vllm
    url = engine.fleet.urls[0]
    policy = LLMPolicy.from_engine(engine, LoraConfig(r=RANK))
    prompt = _chat(engine.tokenizer, "Name three colours.")
    _train_step(policy, seed=11)
    v = engine.policy_version + 1
    run(engine.update_weights(policy.serving_state_dict(), v))
    serving = _greedy(engine, prompt)

    def unreadable(folder):  # vLLM rejects the load
        (folder / ADAPTER_WEIGHTS).write_bytes(b"not safetensors")

    def scaled(folder):  # vLLM loads it, but it is not what the learner holds: the check refuses it
        from safetensors.torch import load_file, save_file

        path = folder / ADAPTER_WEIGHTS
        save_file({k: t * 20 if "lora_B" in k else t for k, t in load_file(str(path)).items()}, str(path))

    for hook, expected in ((unreadable, "was rejected"), (scaled, "refused")):
        _train_step(policy, seed=12)
        engine.sync_hooks.append(hook)
        try:
            with pytest.raises(WeightSyncError) as err:
                run(engine.update_weights(policy.serving_state_dict(), v + 1))
        finally:
            engine.sync_hooks.clear()
        assert expected in str(err.value) and f"serves version {v} (polar-v{v}) again" in str(err.value)
        assert engine.policy_version == v and engine.weight_sync.adapter == f"polar-v{v}"
        assert f"polar-v{v + 1}" not in _served(url)
        still = _greedy(engine, prompt)
        assert (still.token_ids, still.logprobs, still.policy_version) == (
            serving.token_ids, serving.logprobs, v)
    # and the next good sync goes through (the check's model was put back on the serving adapter)
    run(engine.update_weights(policy.serving_state_dict(), v + 1))
    assert engine.last_sync["checks"][url]["ok"] and _greedy(engine, prompt).policy_version == v + 1
