"""Live weight sync into upstream engines, against the stand-ins (polar.testing.standin), which serve
vLLM's dev-mode RL routes and SGLang's documented weight-update routes over a real tiny model.

Each sync writes a safetensors folder, pauses each replica, has it reload the folder, sets its weight
version, resumes it and checks a fixed prompt's logprobs against the learner's. The same paths run against
a real vLLM in tests/inference/test_vllm.py."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import torch

from polar.config.sync import WeightSyncConfig
from polar.inference import GenerationRequest, collect, load_engine
from polar.inference.weight_sync import WeightSyncError
from polar.testing.standin import StandinServer, make_app

from .conftest import chat_prompt


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The tiny model written as an HF folder: what an upstream server would serve."""
    from polar.inference.tiny import build_tiny

    model, tok = build_tiny(3)
    folder = tmp_path_factory.mktemp("tiny-served")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture
def served(tiny_folder):
    """A fresh embedded engine over the folder for each test (syncs change its weights)."""
    from polar.inference.embedded import EmbeddedEngine

    engine = EmbeddedEngine.from_spec(str(tiny_folder))
    yield engine
    run(engine.close())


def perturbed(folder, seed: int, scale: float = 0.05) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    gen = torch.Generator().manual_seed(seed)
    base = load_file(str(folder / "model.safetensors"))
    return {k: v + scale * torch.randn(v.shape, generator=gen) if v.ndim == 2 else v for k, v in base.items()}


def greedy(engine, prompt):
    return run(collect(engine.generate(GenerationRequest(prompt, max_tokens=12, temperature=0.0, stream=False))))


def corrupt_one_tensor(folder):
    """A test hook standing for corruption in transit: one tensor of the written folder is changed."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    name = sorted(k for k in tensors if k.endswith("mlp.down_proj.weight"))[0]
    tensors[name] = tensors[name] * 8.0
    save_file(tensors, str(path))


@pytest.mark.parametrize("api", ["vllm", "sglang"])
def test_sync_pushes_weights_sets_version_and_checks_every_replica(api, served, tiny_folder, tmp_path):
    with StandinServer(make_app(served, api, served_model="m", name="a")) as a, \
            StandinServer(make_app(served, api, served_model="m", name="b")) as b:
        up = load_engine({"kind": api, "urls": [a.url, b.url], "tokenizer": str(tiny_folder)})
        up.configure_sync(WeightSyncConfig(check_tokens=12), tmp_path / "sync")
        prompt = chat_prompt(up.tokenizer, "weights")
        new = perturbed(tiny_folder, seed=1)
        before = greedy(up, prompt)
        run(up.update_weights(new, 1))
        after = greedy(up, prompt)
        assert after.policy_version == 1 and before.policy_version == 0
        # the replica serves exactly the learner's weights now (fp32 on both sides)
        from polar.inference.embedded import sequence_logprobs
        from polar.inference.weight_sync import LogprobCheck

        check = LogprobCheck(tiny_folder, up.tokenizer, "x", 1, 1.0)
        check.load(new)
        ref = sequence_logprobs(check._model, prompt + after.token_ids)[len(prompt) - 1:]
        assert max(abs(x - y) for x, y in zip(ref, after.logprobs, strict=True)) < 1e-4
        assert after.logprobs != before.logprobs
        # each replica was paused, reloaded, versioned and resumed, in that order, and checked
        routes = {"vllm": ["POST /pause", "POST /collective_rpc", "POST /update_weight_version", "POST /resume"],
                  "sglang": ["POST /pause_generation", "POST /update_weights_from_disk", "POST /continue_generation"]}
        for server in (a, b):
            assert server.app.state.standin.control == routes[api]
            info = httpx.get(f"{server.url}/{'weight_info' if api == 'vllm' else 'model_info'}", timeout=30).json()
            assert info["weight_version"] == "1"
        checks = up.last_sync["checks"]
        assert set(checks) == {a.url, b.url} and all(c["ok"] and c["max_abs_diff"] < 1e-3 for c in checks.values())
        # the folder: written atomically, the served config and tokenizer beside the weights, only the last kept
        run(up.update_weights(perturbed(tiny_folder, seed=2), 2))
        assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["v000002"]
        files = sorted(p.name for p in (tmp_path / "sync" / "v000002").iterdir())
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files)
        run(up.close())


@pytest.mark.parametrize("api", ["vllm", "sglang"])
def test_a_tensor_corrupted_in_transit_is_refused_and_the_old_weights_serve_with_their_version(
        api, served, tiny_folder, tmp_path):
    with StandinServer(make_app(served, api, served_model="m")) as server:
        up = load_engine({"kind": api, "urls": [server.url], "tokenizer": str(tiny_folder)})
        up.configure_sync(WeightSyncConfig(), tmp_path / "sync")
        prompt = chat_prompt(up.tokenizer, "corrupt")
        run(up.update_weights(perturbed(tiny_folder, seed=1), 1))
        v1 = greedy(up, prompt)
        up.sync_hooks.append(corrupt_one_tensor)
        with pytest.raises(WeightSyncError) as err:
            run(up.update_weights(perturbed(tiny_folder, seed=2), 2))
        msg = str(err.value)
        assert "weight sync to version 2 refused" in msg and "does not serve the learner's weights" in msg
        assert "gateway.sync.check_tolerance=0.3" in msg and "every replica serves version 1 again" in msg
        diff = float(msg.split("by up to ")[1].split(" ")[0])
        assert diff > 0.3
        # the old weights serve again, with their version; the refused folder is gone
        assert up.policy_version == 1
        again = greedy(up, prompt)
        assert again.token_ids == v1.token_ids and again.policy_version == 1
        assert max(abs(x - y) for x, y in zip(again.logprobs, v1.logprobs, strict=True)) < 1e-5
        info = httpx.get(f"{server.url}/{'weight_info' if api == 'vllm' else 'model_info'}", timeout=30).json()
        assert info["weight_version"] == "1"
        assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["v000001"]
        run(up.close())


def test_a_push_the_server_rejects_fails_loudly_and_keeps_the_version(served, tiny_folder, tmp_path):
    with StandinServer(make_app(served, "sglang", served_model="m")) as server:
        up = load_engine({"kind": "sglang", "urls": [server.url], "tokenizer": str(tiny_folder)})
        up.configure_sync(WeightSyncConfig(), tmp_path / "sync")
        prompt = chat_prompt(up.tokenizer, "rejected")
        before = greedy(up, prompt)

        def drop_weights(folder):
            (folder / "model.safetensors").unlink()

        up.sync_hooks.append(drop_weights)
        with pytest.raises(WeightSyncError, match=r"update_weights_from_disk \(POST /update_weights_from_disk\) was "
                           r"rejected \(HTTP 400\).*no \*\.safetensors.*every replica serves version 0 again"):
            run(up.update_weights(perturbed(tiny_folder, seed=1), 1))
        assert up.policy_version == 0
        after = greedy(up, prompt)
        assert after.token_ids == before.token_ids and after.policy_version == 0
        # the replica was resumed after the failed load: it serves, not left paused
        assert server.app.state.standin.control[-1] == "POST /continue_generation"
        run(up.close())


def test_sync_needs_the_served_models_folder():
    from polar.testing.standin import FixedEngine

    with StandinServer(make_app(FixedEngine(4), "vllm", served_model="tiny")) as server:
        up = load_engine(f"vllm:{server.url}")  # tokenizer "tiny": no folder to write config and tokenizer from
        with pytest.raises(WeightSyncError, match=r"has no local model folder.*set the upstream tokenizer"):
            run(up.update_weights({"w": torch.zeros(1)}, 1))
        run(up.update_weights({}, 2))  # weights synced elsewhere: only the version is stamped
        assert up.policy_version == 2
        run(up.close())


@pytest.mark.parametrize("api", ["vllm", "sglang"])
def test_in_flight_abort_ends_calls_under_way_at_a_sync(api, tmp_path, tiny_folder):
    """``gateway.sync.in_flight: abort``: a call streaming through the gateway when the sync starts ends as
    aborted (recorded with the old version) instead of holding the sync up; with ``finish`` it completes."""
    from openai import OpenAI

    from polar.config.gateway import GatewayConfig
    from polar.gateway import GatewayServer
    from polar.inference.scripted import ScriptedEngine
    from polar.inference.tiny import build_tiny

    model, tok = build_tiny(3)
    slow = ScriptedEngine(tok, lambda req, i: "a long reply " * 40, model=model, model_name="m", token_delay_s=0.05)
    with StandinServer(make_app(slow, api, served_model="m")) as server:
        up = load_engine({"kind": api, "urls": [server.url], "tokenizer": str(tiny_folder)})
        cfg = GatewayConfig(sync=WeightSyncConfig(in_flight="abort", check=False), accept_any_model=True)
        with GatewayServer(cfg, engine=up, records_dir=tmp_path / "records") as gw:
            client = OpenAI(base_url=f"{gw.url}/s/abort/v1", api_key="x", max_retries=0)
            first = threading.Event()
            out: dict = {}

            def call() -> None:
                import openai

                try:
                    for _chunk in client.chat.completions.create(model="m", stream=True,
                                                                 messages=[{"role": "user", "content": "go"}]):
                        first.set()
                except openai.APIError as exc:  # the gateway ends an aborted stream with an error event
                    out["error"] = str(exc)

            t = threading.Thread(target=call)
            t.start()
            assert first.wait(60)
            status = gw.update_weights(perturbed(tiny_folder, seed=1), version=1, timeout_s=60)
            t.join(60)
            assert status["policy_version"] == 1 and status["inflight"] == 0
            assert "aborted the request" in out["error"]
            rec = gw.records("abort")[0]
            assert rec.finish_reason == "abort" and rec.policy_version == 0 and not rec.complete
            assert len(rec.sampled_ids) < len(tok.encode("a long reply " * 40))
            assert ("POST /abort_requests" if api == "vllm" else "POST /abort_request") in server.app.state.standin.control


def test_a_replica_not_admitted_takes_no_calls_and_no_sync(served, tiny_folder, tmp_path):
    """The seam a launcher (and replicas on other nodes) uses: ``router.admits`` hides a replica (restarting,
    not yet holding the current weights) from routing and from weight sync alike; admitted again, it serves."""
    with StandinServer(make_app(served, "vllm", served_model="m", name="a")) as a, \
            StandinServer(make_app(served, "vllm", served_model="m", name="b")) as b:
        up = load_engine({"kind": "vllm", "urls": [a.url, b.url], "tokenizer": str(tiny_folder)})
        up.configure_sync(WeightSyncConfig(check_tokens=4), tmp_path / "sync")
        up.router.admits = lambda url: url != b.url
        sessions = [f"s{i}" for i in range(12)]
        assert {up.route(sid)[0].url for sid in sessions} == {a.url}

        async def calls() -> None:
            for sid in sessions:
                await collect(up.generate(GenerationRequest([1, 2, 3], max_tokens=2, session_id=sid)))

        run(calls())
        assert len(a.requests) == len(sessions) and b.requests == []
        run(up.update_weights(perturbed(tiny_folder, seed=1), 1))
        assert a.app.state.standin.control[-1] == "POST /resume" and b.app.state.standin.control == []
        assert set(up.last_sync["checks"]) == {a.url} and up.last_sync["replicas"] == 1
        up.router.admits = lambda url: True  # back, with the current weights: sticky sessions reach it again
        assert b.url in {up.route(sid)[0].url for sid in sessions}
        run(up.close())
