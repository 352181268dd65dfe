"""polar export: parity of ONNX / TorchScript / int8 graphs with the eager policy, for each agent kind."""

import json
import re

import numpy as np
import pytest
import torch

from polar.deploy.export import PARITY_TOL, export_run
from polar.errors import CheckpointError, DeployError
from polar.trainers.loading import load_policy_for_eval

LSTM = {"type": "lstm", "hidden_sizes": [16], "lstm_hidden_size": 8, "cnn_channels": [4, 8]}
CNN = {"type": "cnn", "hidden_sizes": [16], "cnn_channels": [4, 8]}
CASES = {  # name -> (env, run_config kwargs, formats)
    "mlp-discrete": ("cartpole", {}, ["onnx", "torchscript", "int8"]),
    "mlp-continuous": ("pendulum", {}, ["onnx", "torchscript", "int8"]),
    "cnn-discrete": ("image", {"agent": CNN}, ["onnx", "int8"]),
    "cnn-continuous": ("image", {"agent": CNN, "continuous": True}, ["onnx", "int8"]),
    "lstm-discrete": ("cartpole", {"agent": LSTM}, ["onnx", "torchscript", "int8"]),
    "lstm-continuous": ("pendulum", {"agent": LSTM}, ["onnx", "int8"]),
    "dict-discrete": ("dict", {}, ["onnx", "int8"]),
    "dict-continuous": ("dict", {"continuous": True}, ["onnx", "torchscript", "int8"]),
    "dict-lstm": ("dict", {"agent": LSTM}, ["onnx"]),
    "dict-multidiscrete": ("dict", {"multi": True}, ["onnx"]),
    "sac": ("pendulum", {"policy": "sac"}, ["onnx", "torchscript"]),
    "dqn": ("cartpole", {"policy": "dqn"}, ["onnx"]),
    "bc-normalised": ("cartpole", {"policy": "bc"}, ["onnx"]),  # offline normalize_obs: dataset statistics
}
# the default suite runs every architecture x head x {fp32, int8}; the other formats and agents run in test-all
SLOW = {("lstm-discrete", "torchscript"), ("dict-continuous", "torchscript"), ("dict-lstm", "onnx"),
        ("sac", "torchscript")}
PARAMS = [pytest.param(case, fmt, id=f"{case}-{fmt}", marks=[pytest.mark.slow] if (case, fmt) in SLOW else [])
          for case, (_, _, fmts) in CASES.items() for fmt in fmts]


def _eager_rollout(policy, manifest, steps=6, batch=5, seed=3):
    """Fresh observations (not the recorded ones) stepped through the eager policy, with its state carried."""
    space = policy.agent.observation_space
    space.seed(seed)
    state = policy.agent.get_initial_state(batch)
    rows = []
    for _ in range(steps):
        obs = [space.sample() for _ in range(batch)]
        if isinstance(obs[0], dict):
            batch_obs = {k: np.stack([np.asarray(o[k]) for o in obs]) for k in obs[0]}
            tens = {k: torch.as_tensor(v) for k, v in batch_obs.items()}
        else:
            batch_obs = np.stack(obs)
            tens = torch.as_tensor(batch_obs)
        with torch.inference_mode():
            action, new_state, _ = policy.act(tens, state, True)
        rows.append((batch_obs, state, action.numpy()))
        state = new_state
    return rows


def _feeds(manifest, batch_obs, state, batch):
    graph = manifest["graph"]
    dtypes = {t["name"]: t["dtype"] for t in graph["inputs"]}
    if graph["obs_keys"] is None:
        feeds = {"obs": np.asarray(batch_obs).astype(dtypes["obs"])}
    else:
        feeds = {f"obs.{k}": np.asarray(batch_obs[k]).astype(dtypes[f"obs.{k}"]) for k in graph["obs_keys"]}
    parts = [] if state is None else [state] if isinstance(state, torch.Tensor) else list(state)
    for s, t in zip(graph["state"], parts, strict=True):
        feeds[s["input"]] = t.numpy().astype(np.float32)
    if graph["noise"] is not None:
        feeds["noise"] = np.zeros((batch, graph["noise"]["width"]), np.float32)
    return feeds


@pytest.mark.parametrize("case, fmt", PARAMS)
def test_export_matches_the_eager_policy(make_run, tmp_path, case, fmt):
    env, kw, _ = CASES[case]
    run = make_run(env, **kw)
    out = tmp_path / "export"
    manifest = export_run(run.path, out, "torchscript" if fmt == "torchscript" else "onnx",
                          quantize="int8" if fmt == "int8" else None, trust_code=True)  # its envs are tests.deploy's
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["version"] == "1" and on_disk["run"]["config_hash"].startswith("sha256:")
    assert on_disk["observation_space"]["type"] in ("Box", "Dict")
    assert on_disk["action_space"]["type"] in ("Box", "Discrete", "MultiDiscrete")
    assert (len(on_disk["recurrent_state"]) == 2) == (kw.get("agent") == LSTM)
    parity = manifest["parity"]
    assert parity["samples"] == 1000
    for part in ("vs_policy_act", "deterministic", "sampled"):
        for name, r in parity.get(part, {}).items():
            assert r.get("rows_differ", 0) == 0 and r.get("max_rel", 0.0) <= PARITY_TOL, (part, name, r)

    # independently of the exporter's own check: the file, run by its runtime, on fresh observations
    _, _, policy, _, _ = load_policy_for_eval(run.path)
    model = out / manifest["file"]
    if fmt == "torchscript":
        module = torch.jit.load(str(model))
        names = [t["name"] for t in manifest["graph"]["inputs"]]

        def run_graph(feeds):
            with torch.inference_mode():
                return module(*[torch.from_numpy(feeds[n]) for n in names])[0].numpy()
    else:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

        def run_graph(feeds):
            return sess.run(["action"], feeds)[0]
    agree, deltas = [], []
    for batch_obs, state, want in _eager_rollout(policy, manifest):
        got = run_graph(_feeds(manifest, batch_obs, state, 5))
        if np.issubdtype(want.dtype, np.floating):
            low, high = policy.agent.action_space.low, policy.agent.action_space.high
            deltas.append(np.abs(got - np.clip(want.reshape(got.shape), low, high)).max())
        else:
            agree.append((got == want.reshape(got.shape)).mean())
    if fmt == "int8":
        q = manifest["int8"]
        assert manifest["file"] == "model.int8.onnx" and (out / "model.onnx").is_file()
        import onnx

        ops = {n.op_type for n in onnx.load(str(out / "model.int8.onnx")).graph.node}
        assert "DynamicQuantizeLinear" in ops and ops & {"MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM"}
        if agree:
            assert 0.9 <= q["action_agreement"] <= 1.0 and np.mean(agree) >= 0.8
        else:
            assert 0 < q["action_max_abs_delta"] < 0.25 and max(deltas) < 0.25
    elif agree:
        assert min(agree) == 1.0
    else:
        assert max(deltas) <= 1e-5


def test_normalisation_is_in_the_graph(make_run, tmp_path):
    """The exported graph takes raw observations: the run's statistics change its answer."""
    import onnxruntime as ort

    run = make_run("pendulum")
    manifest = export_run(run.path, tmp_path / "e", samples=64)
    _, _, policy, _, _ = load_policy_for_eval(run.path)
    obs = np.array([[0.9, 0.1, 3.0], [-0.5, 0.8, -6.0]], np.float32)
    sess = ort.InferenceSession(str(tmp_path / "e" / manifest["file"]), providers=["CPUExecutionProvider"])
    got = sess.run(["mean"], {"obs": obs, "noise": np.zeros((2, 1), np.float32)})[0]
    with torch.inference_mode():
        raw = policy.agent.act(torch.as_tensor(obs), None, True)[2]["mean"].numpy()
        normed = policy.act(torch.as_tensor(obs), None, True)[2]["mean"].numpy()
    assert np.abs(got - normed).max() <= 1e-5
    assert np.abs(raw - normed).max() > 1e-3  # without the statistics it would answer something else


def test_sac_actions_are_squashed_into_the_bounds(make_run, tmp_path):
    import onnxruntime as ort

    run = make_run("pendulum", policy="sac")
    manifest = export_run(run.path, tmp_path / "e", samples=32)
    sess = ort.InferenceSession(str(tmp_path / "e" / manifest["file"]), providers=["CPUExecutionProvider"])
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    noise = np.random.default_rng(1).normal(scale=50.0, size=(64, 1)).astype(np.float32)
    action = sess.run(["action"], {"obs": obs, "noise": noise})[0]
    assert action.min() >= -2.0 and action.max() <= 2.0 and np.abs(action).max() > 1.9


def test_export_refuses_an_agent_it_cannot_trace(make_run, tmp_path):
    run = make_run("cartpole", agent={"type": "custom", "module": "tests.deploy.agents", "class_name": "ItemAgent"})
    with pytest.raises(DeployError, match=r"cannot export ItemAgent: its act\(\) turns a tensor into a Python value"):
        export_run(run.path, tmp_path / "e", samples=16, trust_code=True)
    assert not (tmp_path / "e").exists() and not list(tmp_path.glob(".e.tmp-*"))


def test_export_refuses_a_dict_state_by_name(make_run, tmp_path):
    run = make_run("cartpole", agent={"type": "custom", "module": "tests.deploy.agents", "class_name": "DictStateAgent"})
    with pytest.raises(DeployError, match=r"cannot export DictStateAgent: its recurrent state is a dict"):
        export_run(run.path, tmp_path / "e", samples=16, trust_code=True)


def test_export_bad_arguments(make_run, tmp_path):
    run = make_run("cartpole", iterations=(1, 2))
    with pytest.raises(DeployError, match=r"--quantize int8 needs --format onnx"):
        export_run(run.path, tmp_path / "e", "torchscript", quantize="int8")
    with pytest.raises(CheckpointError, match=r"--checkpoint 7: .* has no ckpt_00000007.pt \(iterations checkpointed: 1, 2\)"):
        export_run(run.path, tmp_path / "e", checkpoint=7)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(DeployError, match=r"--out .*busy already holds files that are not a polar export"):
        export_run(run.path, tmp_path / "busy")
    assert export_run(run.path, tmp_path / "e", checkpoint=1, samples=16)["version"] == "1"
    assert export_run(run.path, tmp_path / "e", samples=16)["version"] == "2"  # replaces the earlier export


def test_polar_export_cli(make_run, tmp_path, capsys):
    from polar.cli.main import main

    run = make_run("cartpole")
    assert main(["export", str(run.path), "--format", "onnx", "--quantize", "int8", "--out", str(tmp_path / "e"),
                 "--samples", "200"]) == 0
    err = capsys.readouterr().err
    assert "parity on 200 recorded observations" in err and "int8 (model.int8.onnx): action agreement" in err
    # the line says which measure passed which tolerance: the relative delta, not the absolute one it shows first
    m = re.search(r"max \|delta\| ([\d.e+-]+), max \|delta\| / max\(1, \|eager value\|\) ([\d.e+-]+) <= tolerance "
                  r"([\d.e+-]+) \(relative to values above 1, absolute below\)", " ".join(err.split()))
    assert m is not None, err
    assert float(m.group(2)) <= float(m.group(3)) == PARITY_TOL
    assert main(["export", str(run.path), "--format", "torchscript", "--quantize", "int8",
                 "--out", str(tmp_path / "f")]) == 1
    assert "--quantize int8 needs --format onnx" in capsys.readouterr().err
