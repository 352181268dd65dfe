"""``polar eval --suite``: CartPole under observation noise, the key-door game through its connector and the
calculator agent harness, each over 2 checkpoints and their ensemble, in parallel processes; the report's
numbers are checked against direct evaluations written here (same seeds, same numbers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from polar.evaluation.stats import summarize
from tests.evaluation.helpers import EXAMPLES, make_agent_run, make_env_run

NOISE = 0.1
CART_SEEDS = list(range(1_000_000, 1_000_008))
KEY_SEEDS = list(range(2_000_000, 2_000_004))


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    cart = make_env_run(root / "cartpole", EXAMPLES / "cartpole_ppo.yaml", seeds=(1, 2))
    key = make_env_run(root / "keydoor", EXAMPLES / "keydoor" / "demo.yaml", seeds=(3, 4))
    tasks = [json.loads(line) for line in (EXAMPLES / "agentic" / "heldout.jsonl").read_text().splitlines()[:3]]
    calc = make_agent_run(root / "calc", tasks)
    suite = {
        "name": "smoke",
        "parallel": {"backend": "local", "workers": 2},
        "interval": {"method": "bootstrap", "level": 0.9, "resamples": 500, "seed": 3},
        "policies": [
            {"name": "cart-1", "checkpoint": "cartpole/checkpoints/ckpt_00000001.pt"},
            {"name": "cart-2", "run": "cartpole"},
            {"name": "cart-ens", "ensemble": ["cart-1", "cart-2"]},
            {"name": "key-1", "checkpoint": "keydoor/checkpoints/ckpt_00000001.pt"},
            {"name": "key-2", "checkpoint": "keydoor/checkpoints/ckpt_00000002.pt"},
            {"name": "key-ens", "ensemble": ["key-1", "key-2"]},
            {"name": "tiny-base", "model": "tiny"},
            {"name": "calc-1", "checkpoint": "calc/checkpoints/ckpt_00000001.pt"},
            {"name": "calc-2", "run": "calc"},
            {"name": "calc-ens", "ensemble": ["calc-1", "calc-2"]},
        ],
        "harnesses": [
            {"name": "cartpole-noisy", "policies": ["cart-1", "cart-2", "cart-ens"],
             "harness": {"type": "gymnasium", "id": "CartPole-v1"},
             "wrappers": [{"type": "observation_noise", "std": NOISE}],
             "seeds": {"start": CART_SEEDS[0], "count": len(CART_SEEDS)}, "num_envs": 3,
             "metrics": ["return", "episode_length", "time_to_completion_s"]},
            {"name": "keydoor", "policies": ["key-1", "key-2", "key-ens"], "num_envs": 2, "max_episode_steps": 60,
             "seeds": {"start": KEY_SEEDS[0], "count": len(KEY_SEEDS)},
             "metrics": ["return", "success_rate", "episode_length", {"name": "constraint_violations",
                                                                       "info_key": "polar/connector_restart"}]},
            {"name": "calculator", "kind": "agent", "policies": ["tiny-base", "calc-1", "calc-2", "calc-ens"],
             "config": str(EXAMPLES / "agentic" / "calculator_grpo.yaml"), "tasks": "calc-heldout.jsonl"},
        ],
    }
    (root / "suite.yaml").write_text(yaml.safe_dump(suite))
    proc = subprocess.run([sys.executable, "-m", "polar.cli.main", "eval", "--suite", str(root / "suite.yaml"), "--trust-code",
                           "--out", str(root / "report")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "written:" in proc.stderr and "cart-ens" in proc.stderr  # the tables polar eval prints
    report = json.loads((root / "report" / "report.json").read_text())
    return root, report, cart, key, calc


def _row(report, harness, policy):
    return next(r for r in report["results"] if r["harness"] == harness and r["policy"] == policy)


@torch.inference_mode()
def _direct_env(env: gym.Env, act, seeds, max_steps=100_000):
    """The plainest loop: reset with the seed, act on one observation at a time, sum rewards."""
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        ret, n, info = 0.0, 0, {}
        while True:
            obs, r, term, trunc, info = env.step(act(obs))
            ret += float(r)
            n += 1
            if term or trunc or n >= max_steps:
                break
        out.append((ret, n, info.get("success")))
    return out


def _batched(obs):
    return {k: torch.as_tensor(np.asarray(v)[None]) for k, v in obs.items()} if isinstance(obs, dict) \
        else torch.as_tensor(np.asarray(obs)[None])


def test_suite_writes_all_three_formats(suite_run):
    root, report, *_ = suite_run
    out = root / "report"
    assert report["format"] == 1 and report["suite"] == "smoke"
    assert [r["error"] for r in report["results"]] == [None] * 10
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for name in ("cartpole-noisy", "keydoor", "calculator", "cart-ens", "key-ens", "calc-ens", "tiny-base"):
        assert name in md and name in html
    assert "90% confidence intervals: percentile bootstrap" in md
    assert html.count("<svg") == 3 + 4 + 6  # one plot per metric of each harness
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # offline: nothing fetched


def test_cartpole_numbers_match_a_direct_evaluation(suite_run):
    from polar.evaluation.wrappers import ObservationNoise
    from polar.trainers.loading import load_policy_for_eval

    _root, report, cart, *_ = suite_run
    policies = {}
    for name, ckpt in (("cart-1", "ckpt_00000001.pt"), ("cart-2", "ckpt_00000002.pt")):
        policies[name] = load_policy_for_eval(cart / "checkpoints" / ckpt)[2]

    def greedy(p):
        return lambda obs: int(p.act(_batched(obs), None, True)[0][0])

    def ensemble(obs):  # the mean of the two softmax distributions, written out
        probs = [torch.softmax(p.act(_batched(obs), None, False)[2]["logits"], -1) for p in policies.values()]
        return int(((probs[0] + probs[1]) / 2).argmax(-1)[0])

    acts = {"cart-1": greedy(policies["cart-1"]), "cart-2": greedy(policies["cart-2"]), "cart-ens": ensemble}
    iv = report["interval"]
    returns = {}
    for name, act in acts.items():
        direct = _direct_env(ObservationNoise(gym.make("CartPole-v1"), NOISE), act, CART_SEEDS)
        row = _row(report, "cartpole-noisy", name)
        assert [e["seed"] for e in row["episodes"]] == CART_SEEDS
        assert [e["return"] for e in row["episodes"]] == [r for r, _, _ in direct]
        assert [e["episode_length"] for e in row["episodes"]] == [n for _, n, _ in direct]
        want = summarize([r for r, _, _ in direct], iv["method"], iv["level"], iv["resamples"], iv["seed"])
        assert row["metrics"]["return"] == want
        assert row["metrics"]["return"]["low"] <= want["mean"] <= row["metrics"]["return"]["high"]
        returns[name] = [r for r, _, _ in direct]
    assert returns["cart-1"] != returns["cart-2"]  # two different policies, told apart by the report


def test_keydoor_numbers_match_a_direct_evaluation_through_the_connector(suite_run):
    from polar.config import load_config
    from polar.harness import make_env
    from polar.trainers.loading import load_policy_for_eval

    _root, report, _, key, _ = suite_run
    cfg = load_config(EXAMPLES / "keydoor" / "demo.yaml")
    env = make_env(cfg.harness, cfg.config_dir)
    try:
        for name, ckpt in (("key-1", "ckpt_00000001.pt"), ("key-2", "ckpt_00000002.pt")):
            p = load_policy_for_eval(key / "checkpoints" / ckpt)[2]
            direct = _direct_env(env, lambda obs, p=p: int(p.act(_batched(obs), None, True)[0][0]), KEY_SEEDS, 60)
            row = _row(report, "keydoor", name)
            assert [e["return"] for e in row["episodes"]] == pytest.approx([r for r, _, _ in direct], abs=1e-5)
            assert [e["episode_length"] for e in row["episodes"]] == [n for _, n, _ in direct]
            succ = [s for _, _, s in direct]
            assert [e["success"] for e in row["episodes"]] == [None if s is None else bool(s) for s in succ]
            assert row["metrics"]["constraint_violations"]["mean"] == 0.0  # no connector restarts
    finally:
        env.close()
    assert _row(report, "keydoor", "key-ens")["n"] == len(KEY_SEEDS)


def _sampled(records_dir: Path) -> list[tuple[int, ...]]:
    """Every call's sampled token ids in a gateway records folder, sorted (sessions run concurrently)."""
    calls = [json.loads(line) for f in records_dir.glob("*.jsonl") for line in f.read_text().splitlines() if line]
    assert calls
    return sorted(tuple(c["sampled_ids"]) for c in calls)


def test_calculator_numbers_match_a_direct_evaluation(suite_run):
    from polar.evaluation.agents import GreedyEngine
    from polar.inference import load_engine
    from polar.trainers.agentic_run import evaluate_agent_run
    from polar.trainers.loading import load_run

    root, report, _, _, calc = suite_run
    run_dir, cfg = load_run(calc)
    for name, ckpt in (("calc-1", "ckpt_00000001.pt"), ("calc-2", "ckpt_00000002.pt")):
        engine = GreedyEngine(load_engine("tiny", seed=cfg.seed))
        direct = evaluate_agent_run(run_dir, cfg, calc / "checkpoints" / ckpt, samples=1, engine=engine)
        row = _row(report, "calculator", name)
        assert row["n"] == direct["sessions"] == 3
        assert row["metrics"]["return"]["mean"] == pytest.approx(direct["success"])
        assert sum(e["status"] == "error" for e in row["episodes"]) == direct["errors"]
        assert all(e["num_calls"] >= 1 and e["completion_tokens"] >= 1 for e in row["episodes"])
        assert row["metrics"]["tokens_per_session"]["mean"] > row["metrics"]["calls_per_session"]["mean"]
        assert row["metrics"]["cost_per_session_usd"]["mean"] == 0.0  # a local model, no prices given
        # greedy decoding: the suite's sessions sampled exactly the tokens the direct evaluation's did
        assert _sampled(root / "report" / "sessions" / f"calculator--{name}") == _sampled(Path(direct["records"]))
    base, ens = _row(report, "calculator", "tiny-base"), _row(report, "calculator", "calc-ens")
    # the base model and checkpoint 1 hold the same weights and decode greedily: the same sessions
    c1 = _row(report, "calculator", "calc-1")
    assert [e["completion_tokens"] for e in base["episodes"]] == [e["completion_tokens"] for e in c1["episodes"]]
    assert ens["n"] == 3 and ens["error"] is None
