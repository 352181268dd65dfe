"""Speculative decoding on a real vLLM CPU server launched by polar (``engine_kwargs.speculative``): it runs
(vLLM's own counters show proposals made and accepted), and the tokens and logprobs recorded for training are
the served model's, the same as without speculation and as a plain forward pass of the model."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from polar.inference import GenerationRequest, collect

pytestmark = pytest.mark.vllm

# vLLM computes in bf16 on CPUs with bf16 instructions (fp32 elsewhere), the reference in fp32
BF16_LOGPROB_TOLERANCE = 0.15
PROMPT = ("Repeat this text exactly: the quick brown fox jumps over the lazy dog, "
          "the quick brown fox jumps over the lazy dog.")


@pytest.fixture(scope="module")
def speculative_vllm(vllm_model_folder, tmp_path_factory, launched_vllm):
    """A second replica, with n-gram speculation; started after the shared one, stopped at the end."""
    from polar.inference.vllm_launcher import launch_vllm

    engine = launch_vllm(str(vllm_model_folder), log_dir=tmp_path_factory.mktemp("vllm-spec-logs"), enforce_eager=True,
                         max_model_len=2048, dtype=launched_vllm.fleet.config.dtype,
                         speculative={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    yield engine
    asyncio.run(engine.close())


def greedy(engine, prompt_ids):
    return asyncio.run(collect(engine.generate(GenerationRequest(
        prompt_ids, max_tokens=40, temperature=0.0, stop_token_ids=engine.default_stop_token_ids, stream=False))))


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def test_speculation_runs_and_records_the_served_models_tokens_and_logprobs(speculative_vllm, launched_vllm,
                                                                            vllm_model_folder):
    from transformers import AutoModelForCausalLM

    from polar.inference.sampling import sequence_logprobs

    fleet = speculative_vllm.fleet
    log_text = fleet.replicas[0].log_path.read_text(errors="replace")
    assert '--speculative-config {"method": "ngram", "num_speculative_tokens": 3' in log_text
    tok = speculative_vllm.tokenizer
    rendered = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True)
    prompt = tok.encode(rendered, add_special_tokens=False)
    drafted_before = metric(fleet.urls[0], "vllm:spec_decode_num_draft_tokens_total")
    spec = greedy(speculative_vllm, prompt)
    base = greedy(launched_vllm, prompt)
    # speculation happened: vLLM proposed tokens for this request and accepted some
    assert metric(fleet.urls[0], "vllm:spec_decode_num_draft_tokens_total") > drafted_before
    assert metric(fleet.urls[0], "vllm:spec_decode_num_accepted_tokens_total") > 0
    # the same greedy answer, with the served model's logprobs, token by token
    assert len(spec.token_ids) >= 10 and spec.token_ids == base.token_ids
    assert spec.logprobs == pytest.approx(base.logprobs, abs=BF16_LOGPROB_TOLERANCE)
    model = AutoModelForCausalLM.from_pretrained(str(vllm_model_folder), dtype="float32")
    reference = sequence_logprobs(model, prompt + spec.token_ids)[len(prompt) - 1:]
    assert spec.logprobs == pytest.approx(reference, abs=BF16_LOGPROB_TOLERANCE)
