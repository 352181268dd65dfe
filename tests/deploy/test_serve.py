"""polar serve over real HTTP on 127.0.0.1: the Open Inference Protocol v2 routes, /v1/act, micro-batching,
recurrent sessions, bad input, and rolling reload under concurrent requests."""

import asyncio
import json
import shutil
import threading
import time

import httpx
import numpy as np
import pytest
import torch

from polar.deploy.export import export_run
from polar.trainers.checkpoint import CheckpointManager
from polar.trainers.loading import load_policy_for_eval
from tests.deploy.serving import LiveServer

LSTM = {"type": "lstm", "hidden_sizes": [16], "lstm_hidden_size": 8}
OBS = [[0.01, 0.2, -0.03, 0.1], [0.1, -0.5, 0.05, 0.3], [-0.2, 0.0, 0.1, -0.4]]


def eager(run_path, obs, state=None, checkpoint=None):
    target = run_path if checkpoint is None else run_path / "checkpoints" / f"ckpt_{checkpoint:08d}.pt"
    _, _, policy, _, _ = load_policy_for_eval(target)
    with torch.inference_mode():
        action, new_state, info = policy.act(torch.tensor(obs, dtype=torch.float32), state, True)
    return action.numpy(), new_state, info


def oip(obs, **params):
    body = {"inputs": [{"name": "obs", "shape": [len(obs), 4], "datatype": "FP32", "data": obs}]}
    if params:
        body["parameters"] = params
    return body


@pytest.fixture
def served(make_run, tmp_path):
    run = make_run("cartpole", iterations=(1, 2))
    repo = tmp_path / "cartpole-ppo"  # the model repository layout: <name>/<version>/
    export_run(run.path, repo / "1", checkpoint=1, samples=32)
    return run, repo


def test_oip_routes_and_inference(served):
    run, repo = served
    with LiveServer(repo, poll_s=0) as s:
        c = s.client
        assert c.get("/v2/health/live").json() == {"live": True}
        assert c.get("/v2/health/ready").json() == {"ready": True}
        assert c.get("/v2").json()["name"] == "polar"
        meta = c.get("/v2/models/cartpole-ppo").json()
        assert meta["name"] == "cartpole-ppo" and meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
        assert {"name": "obs", "datatype": "FP32", "shape": [-1, 4]} in meta["inputs"]
        assert {"name": "action", "datatype": "INT64", "shape": [-1]} in meta["outputs"]
        assert c.get("/v2/models/cartpole-ppo/ready").json()["ready"] is True
        assert c.get("/v2/models/cartpole-ppo/versions/1/ready").json() == {"name": "cartpole-ppo", "version": "1",
                                                                            "ready": True}
        r = c.post("/v2/models/cartpole-ppo/infer", json={**oip(OBS), "id": "req-7"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model_name"] == "cartpole-ppo" and body["model_version"] == "1" and body["id"] == "req-7"
        outs = {o["name"]: o for o in body["outputs"]}
        want, _, info = eager(run.path, OBS, checkpoint=1)
        assert outs["action"]["shape"] == [3] and outs["action"]["datatype"] == "INT64"
        assert outs["action"]["data"] == want.tolist()
        assert np.allclose(outs["value"]["data"], info["values"].numpy(), atol=1e-5)
        assert outs["logits"]["shape"] == [3, 2]
        r = c.post("/v2/models/cartpole-ppo/versions/1/infer", json={**oip(OBS), "outputs": [{"name": "action"}]})
        assert [o["name"] for o in r.json()["outputs"]] == ["action"]
        # /v1/act: one observation, or a batch
        one = c.post("/v1/act", json={"observation": OBS[1]}).json()
        assert one["action"] == int(want[1]) and one["model_version"] == "1"
        many = c.post("/v1/act", json={"observations": OBS}).json()
        assert many["actions"] == want.tolist() and len(many["values"]) == 3
        metrics = c.get("/metrics").text
        assert 'polar_serve_requests_total{code="200",endpoint="infer"} 2.0' in metrics
        assert "polar_serve_versions_loaded 1.0" in metrics


def test_sampled_actions_vary_and_deterministic_ones_do_not(served):
    _, repo = served
    with LiveServer(repo, poll_s=0, seed=0) as s:
        obs = [OBS[0]] * 200
        det = s.client.post("/v1/act", json={"observations": obs}).json()["actions"]
        smp = s.client.post("/v1/act", json={"observations": obs, "deterministic": False}).json()["actions"]
        assert len(set(det)) == 1 and set(smp) == {0, 1}


def test_concurrent_requests_are_micro_batched_and_split_back(served):
    run, repo = served
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(24, 4)).astype(np.float32).round(3).tolist()
    want, _, _ = eager(run.path, obs, checkpoint=1)

    async def fire(url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            rs = await asyncio.gather(*(c.post("/v1/act", json={"observation": o}) for o in obs))
        return [r.json()["action"] for r in rs]

    with LiveServer(repo, poll_s=0, max_wait_ms=50) as s:
        got = asyncio.run(fire(s.url))
        calls = s.policy_server.metrics.registry.get_sample_value("polar_serve_batch_rows_count")
        rows = s.policy_server.metrics.registry.get_sample_value("polar_serve_batch_rows_sum")
    assert got == want.tolist()  # each answer is its own row's, whatever batch it ran in
    assert rows == 24 and calls < 24

    async def fire_triples(url):  # 3-row requests against batches of at most 4 rows: one request per call
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            rs = await asyncio.gather(*(c.post("/v1/act", json={"observations": obs[i:i + 3]}) for i in range(0, 24, 3)))
        return [a for r in rs for a in r.json()["actions"]]

    with LiveServer(repo, poll_s=0, max_wait_ms=50, max_batch_size=4) as s:
        assert asyncio.run(fire_triples(s.url)) == want.tolist()
        assert s.policy_server.metrics.registry.get_sample_value("polar_serve_batch_rows_count") == 8


def test_recurrent_state_per_session(make_run, tmp_path):
    run = make_run("cartpole", agent=LSTM)
    export_run(run.path, tmp_path / "e", samples=32)
    _, _, policy, _, _ = load_policy_for_eval(run.path)
    o1, o2 = [OBS[0]], [OBS[1]]
    with torch.inference_mode():
        a1, s1, _ = policy.act(torch.tensor(o1), policy.agent.get_initial_state(1), True)
        a2, s2, _ = policy.act(torch.tensor(o2), s1, True)
        b2, _, _ = policy.act(torch.tensor(o2), policy.agent.get_initial_state(1), True)
    meta_state = [{"name": "state.0", "datatype": "FP32", "shape": [-1, 8]},
                  {"name": "state.1", "datatype": "FP32", "shape": [-1, 8]}]

    def step(c, obs, **params):
        r = c.post("/v2/models/cartpole-ppo/infer", json=oip(obs, **params))
        assert r.status_code == 200, r.text
        return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}

    with LiveServer(tmp_path / "e", poll_s=0, max_sessions=2) as s:
        meta = s.client.get("/v2/models/cartpole-ppo").json()
        assert all(m in meta["inputs"] for m in meta_state) and meta["parameters"]["recurrent"] is True
        first = step(s.client, o1, session_id="a")
        assert np.allclose(first["next_state.0"], s1[0].numpy(), atol=1e-5)
        second = step(s.client, o2, session_id="a")
        assert np.allclose(second["next_state.0"], s2[0].numpy(), atol=1e-5)
        assert np.allclose(second["next_state.1"], s2[1].numpy(), atol=1e-5)
        assert second["action"].tolist() == a2.tolist()
        # another session starts from zeros; episode_start resets one
        assert np.allclose(step(s.client, o2, session_id="b")["next_state.0"], step(s.client, o2)["next_state.0"])
        reset = step(s.client, o2, session_id="a", episode_start=True)
        assert reset["action"].tolist() == b2.tolist() and not np.allclose(reset["next_state.0"], s2[0].numpy())
        # the header names the session too; state given as inputs is used as is (stateless clients)
        r = s.client.post("/v1/act", json={"observation": o1[0]}, headers={"x-polar-session": "h"})
        assert r.json()["action"] == int(a1[0])
        body = oip(o2)
        body["inputs"] += [{"name": f"state.{i}", "shape": [1, 8], "datatype": "FP32", "data": t.numpy().tolist()}
                           for i, t in enumerate(s1)]
        given = s.client.post("/v2/models/cartpole-ppo/infer", json=body).json()
        assert np.allclose(next(o["data"] for o in given["outputs"] if o["name"] == "next_state.0"),
                           s2[0].numpy().reshape(-1), atol=1e-5)
        assert len(s.policy_server.sessions.items) <= 2  # the LRU bound


BAD = [  # (path, body or raw text, status, words the error must hold)
    ("/v2/models/cartpole-ppo/infer", "{not json", 400, "not valid JSON"),
    ("/v2/models/cartpole-ppo/infer", [1, 2], 400, "JSON object with 'inputs'"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": []}, 400, "'inputs' must be a non-empty list"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": [{"name": "obs", "shape": [1, 4], "datatype": "FP32"}]}, 400,
     "'inputs[0]' lacks 'data'"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": [{"name": "pixels", "shape": [1, 4], "datatype": "FP32",
                                                   "data": [0, 0, 0, 0]}]}, 400, "'inputs[0].name': 'pixels' is not an input"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": [{"name": "obs", "shape": [1, 4], "datatype": "FP64",
                                                   "data": [0, 0, 0, 0]}]}, 400, "'inputs[0].datatype' is FP64"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": [{"name": "obs", "shape": [1, 4], "datatype": "FLOAT",
                                                   "data": [0, 0, 0, 0]}]}, 400, "not an OIP datatype"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": [{"name": "obs", "shape": [1, 5], "datatype": "FP32",
                                                   "data": [0] * 5}]}, 400, "'inputs[0].shape' is [1, 5]"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": [{"name": "obs", "shape": [2, 4], "datatype": "FP32",
                                                   "data": [0] * 7}]}, 400, "'inputs[0].data' has 7 values"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": [{"name": "obs", "shape": [2, 4], "datatype": "FP32",
                                                   "data": [[0, 0, 0, 0], [0, 0]]}]}, 400, "'inputs[0].data' is ragged"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": [{"name": "obs", "shape": [1, 4], "datatype": "FP32",
                                                   "data": ["a", "b", "c", "d"]}]}, 400, "must hold numbers"),
    ("/v2/models/cartpole-ppo/infer", {"inputs": [{"name": "obs", "shape": [300, 4], "datatype": "FP32",
                                                   "data": [0] * 1200}]}, 413, "over this server's max_batch_size 256"),
    ("/v2/models/cartpole-ppo/infer", {**oip([[0, 0, 0, 0]]), "parameters": {"deterministic": "yes"}}, 400,
     "'parameters.deterministic' must be true or false"),
    ("/v2/models/cartpole-ppo/infer", {**oip([[0, 0, 0, 0]]), "outputs": [{"name": "q"}]}, 400,
     "'outputs[0].name': 'q' is not an output"),
    ("/v2/models/nope/infer", oip([[0, 0, 0, 0]]), 404, "model 'nope' is not served here (models: cartpole-ppo)"),
    ("/v2/models/cartpole-ppo/versions/9/infer", oip([[0, 0, 0, 0]]), 404,
     "version '9' of model 'cartpole-ppo' is not loaded (loaded: 1)"),
    ("/v1/act", {"observation": [0, 0, 0]}, 400, "'observation.data' has 3 values"),
    ("/v1/act", {"obs": [0, 0, 0, 0]}, 400, "give either 'observation' (one) or 'observations'"),
    ("/v1/act", {"observation": [0, 0, 0, 0], "session_id": ""}, 400, "'body.session_id' must be a non-empty string"),
    ("/v1/nowhere", {}, 404, "no route for POST /v1/nowhere"),
]


def test_bad_input_gets_an_oip_error_naming_the_field_and_the_server_keeps_serving(served):
    _, repo = served
    with LiveServer(repo, poll_s=0, max_body_bytes=64 * 1024) as s:
        for path, body, status, words in BAD:
            kw = {"content": body} if isinstance(body, str) else {"json": body}
            r = s.client.post(path, headers={"content-type": "application/json"}, **kw)
            assert r.status_code == status, (path, body, r.text)
            assert words in r.json()["error"], (words, r.json())
        big = s.client.post("/v1/act", json={"observations": [[0.0, 0.0, 0.0, 0.0]] * 20_000})
        assert big.status_code == 413 and "over the limit of 65536" in big.json()["error"]
        assert s.client.get("/v2/models/nope").status_code == 404
        assert s.client.post("/v1/act", json={"observation": OBS[0]}).status_code == 200


def test_rolling_reload_under_concurrent_requests_fails_none(served, caplog):
    run, repo = served
    failures, versions = [], []
    stop = threading.Event()

    def client(url):
        with httpx.Client(base_url=url, timeout=30) as c:
            while not stop.is_set():
                try:
                    r = c.post("/v2/models/cartpole-ppo/infer", json=oip(OBS))
                    if r.status_code != 200:
                        failures.append(r.text)
                    else:
                        versions.append(r.json()["model_version"])
                except httpx.HTTPError as e:
                    failures.append(repr(e))

    with LiveServer(repo, poll_s=0.1) as s:
        threads = [threading.Thread(target=client, args=(s.url,)) for _ in range(8)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)
            export_run(run.path, repo / "2", checkpoint=2, samples=32)  # renamed into place when complete
            s.wait_for_version("cartpole-ppo", "2")
            # a corrupt export: logged, counted, and version 2 keeps serving
            shutil.copytree(repo / "2", repo / ".tmp3")
            manifest = json.loads((repo / ".tmp3" / "manifest.json").read_text())
            (repo / ".tmp3" / "manifest.json").write_text(json.dumps({**manifest, "version": "3"}))
            (repo / ".tmp3" / "model.onnx").write_bytes(b"not an onnx graph")
            (repo / ".tmp3").rename(repo / "3")
            deadline = time.monotonic() + 30
            reg = s.policy_server.metrics.registry
            while not reg.get_sample_value("polar_serve_reloads_total", {"outcome": "failed"}) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        meta = s.client.get("/v2/models/cartpole-ppo").json()
        old = s.client.post("/v2/models/cartpole-ppo/versions/1/infer", json=oip(OBS))
    assert failures == []
    assert "1" in versions and versions[-1] == "2" and "3" not in versions
    assert meta["versions"] == ["1", "2"] and meta["parameters"]["default_version"] == "2"
    assert old.status_code == 200 and old.json()["model_version"] == "1"  # versions side by side
    assert any("not loading version 3" in r.getMessage() and "onnxruntime cannot load" in r.getMessage()
               and "still serving version 2" in r.getMessage() for r in caplog.records)
    want2, _, _ = eager(run.path, OBS, checkpoint=2)
    assert want2.shape == (3,)


def test_a_run_directory_serves_its_checkpoints_on_torch(make_run):
    run = make_run("pendulum", iterations=(1,))
    obs = [[0.5, 0.5, 1.0]]
    with LiveServer(run.path, poll_s=0.1, backend="torch") as s:
        meta = s.client.get("/v2/models/pendulum-ppo").json()
        assert meta["platform"] == "pytorch" and meta["versions"] == ["1"]
        # the trainer writes the next checkpoint: it becomes the default version
        from tests.deploy.conftest import run_config, write_run

        other = write_run(run.path.parent / "other", run_config("pendulum"), iterations=(2,))
        state = torch.load(other.checkpoints_dir / "ckpt_00000002.pt", weights_only=True)
        CheckpointManager(run.checkpoints_dir, keep=10).save(2, state)
        s.wait_for_version("pendulum-ppo", "2")
        got = s.client.post("/v1/act", json={"observation": obs[0]}).json()
        # a torn or foreign checkpoint file: logged and counted, version 2 keeps serving
        (run.checkpoints_dir / "ckpt_00000003.pt").write_bytes(b"\x80\x02garbage")
        reg = s.policy_server.metrics.registry
        deadline = time.monotonic() + 30
        while not reg.get_sample_value("polar_serve_reloads_total", {"outcome": "failed"}) and time.monotonic() < deadline:
            time.sleep(0.05)
        why = s.policy_server.failures[str(run.checkpoints_dir / "ckpt_00000003.pt")]
        assert "ckpt_00000003.pt is unreadable" in why
        again = s.client.post("/v1/act", json={"observation": obs[0]}).json()
        assert again["model_version"] == "2"
    _, _, policy, _, _ = load_policy_for_eval(run.checkpoints_dir / "ckpt_00000002.pt")
    with torch.inference_mode():
        want = np.clip(policy.act(torch.tensor(obs), None, True)[0].numpy(), -2, 2)
    assert got["model_version"] == "2" and np.allclose(got["action"], want[0], atol=1e-5)


def test_polar_serve_refuses_a_directory_with_nothing_to_serve(tmp_path, capsys):
    from polar.cli.main import main

    (tmp_path / "empty").mkdir()
    assert main(["serve", str(tmp_path / "empty")]) == 1
    assert "holds no export (a directory with manifest.json) to serve" in capsys.readouterr().err


def test_polar_serve_stops_with_one_line_when_no_version_loads(served, capsys):
    from polar.cli.main import main

    _, repo = served
    (repo / "1" / "model.onnx").write_bytes(b"corrupt")
    assert main(["serve", str(repo), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "error: no version in" in err and "onnxruntime cannot load" in err and "Traceback" not in err


@pytest.mark.slow  # two interpreter starts; benchmarks/serve_load.py drives the command as well
def test_polar_serve_command(served, tmp_path):
    import socket
    import subprocess
    import sys

    _, repo = served
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "polar.cli.main", "serve", str(repo), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
            assert proc.poll() is None, proc.stdout.read()
        r = httpx.post(f"http://127.0.0.1:{port}/v1/act", json={"observation": OBS[0]}, timeout=10)
        assert r.status_code == 200 and r.json()["model_version"] == "1"
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode is not None


def test_dict_observations_through_both_routes(make_run, tmp_path):
    run = make_run("dict")
    export_run(run.path, tmp_path / "e", samples=32, trust_code=True)  # its env is tests.deploy.envs
    _, _, policy, _, _ = load_policy_for_eval(run.path)
    space = policy.agent.observation_space
    space.seed(0)
    obs = [space.sample() for _ in range(3)]
    with torch.inference_mode():
        batch = {k: torch.as_tensor(np.stack([np.asarray(o[k]) for o in obs])) for k in obs[0]}
        want = policy.act(batch, None, True)[0].numpy().tolist()
    plain = [{"pixels": o["pixels"].tolist(), "pos": o["pos"].tolist(), "mode": int(o["mode"])} for o in obs]
    with LiveServer(tmp_path / "e", poll_s=0) as s:
        assert s.client.post("/v1/act", json={"observations": plain}).json()["actions"] == want
        inputs = [{"name": "obs.mode", "shape": [3], "datatype": "INT64", "data": [int(o["mode"]) for o in obs]},
                  {"name": "obs.pixels", "shape": [3, 8, 8, 1], "datatype": "UINT8", "data": [o["pixels"].tolist() for o in obs]},
                  {"name": "obs.pos", "shape": [3, 3], "datatype": "FP32", "data": [o["pos"].tolist() for o in obs]}]
        r = s.client.post("/v2/models/dict-ppo/infer", json={"inputs": inputs, "outputs": [{"name": "action"}]})
        assert r.json()["outputs"][0]["data"] == want
        bad = [dict(inputs[0]), {**inputs[1], "data": [300] * 192}, inputs[2]]
        r = s.client.post("/v2/models/dict-ppo/infer", json={"inputs": bad})
        assert r.status_code == 400 and "'inputs[1].data' has values outside UINT8's range 0..255" in r.json()["error"]
        r = s.client.post("/v2/models/dict-ppo/infer", json={"inputs": inputs[1:]})
        assert r.status_code == 400 and "'inputs' lacks 'obs.mode' (INT64, shape [-1])" in r.json()["error"]
        r = s.client.post("/v1/act", json={"observation": {"pixels": plain[0]["pixels"], "pos": plain[0]["pos"]}})
        assert r.status_code == 400 and "'observation' lacks key 'mode'" in r.json()["error"]
