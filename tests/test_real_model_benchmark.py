"""benchmarks/agentic_real_model.py end to end at smoke scale (tiny model, embedded engine, 2 GRPO steps), and the
sums task family it trains on (examples/agentic/sums.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "agentic"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sums():
    return _module("sums", EXAMPLES / "sums.py")


def test_sums_heldout_problems_are_disjoint_and_scored_exactly(sums):
    assert not set(sums.TRAIN_PAIRS) & set(sums.HELDOUT_PAIRS)
    assert len(sums.TRAIN_PAIRS) + len(sums.HELDOUT_PAIRS) == 400
    train = {sums.problem(s) for s in range(2000)}
    held = {sums.problem(sums.HELDOUT_START + s) for s in range(2000)}
    assert train <= set(sums.TRAIN_PAIRS) and held <= set(sums.HELDOUT_PAIRS) and len(held) == len(sums.HELDOUT_PAIRS)
    seed = sums.HELDOUT_START + 3
    a, b = sums.problem(seed)
    right = str(a + b)
    assert sums.verify({"seed": seed}, f"blah\n {right}.")["reward"] == 1.0
    # held-out: no partial credit, whatever the reply holds
    assert sums.verify({"seed": seed}, f"{a} + {b} = {right}")["reward"] == 0.0
    assert sums.verify({"seed": seed}, f"{right} is it\n7")["reward"] == 0.0
    # training: partial credit, below an exact answer
    ta, tb = sums.problem(5)
    tr = str(ta + tb)
    assert sums.verify({"seed": 5}, f"x\n{tr}")["reward"] == 1.0
    assert sums.verify({"seed": 5}, "x\n99999")["reward"] == 0.5  # the bare format, wrong
    assert sums.verify({"seed": 5}, f"x\nit is {tr}")["reward"] == 0.1  # right, among words
    assert sums.verify({"seed": 5}, f"it is {tr}\nno")["reward"] == 0.05
    assert sums.verify({"seed": 5}, "no\nidea")["reward"] == 0.0
    assert sums.verify({"seed": 5}, "x\nit is 99999", partial_credit=False)["reward"] == 0.0


def test_benchmark_smoke_runs_the_config_and_reports_every_field(tmp_path):
    bench = _module("agentic_real_model", ROOT / "benchmarks" / "agentic_real_model.py")
    overrides = ["model.name_or_path=tiny", "policy.kwargs.total_steps=2", "policy.kwargs.group_size=2",
                 "policy.kwargs.tasks_per_step=2", "eval_tasks.count=4", "policy.kwargs.lora.r=2"]
    row = bench.run_one(str(bench.CONFIG), "embedded", overrides, str(tmp_path))
    assert set(bench.FIELDS) <= set(row)
    assert row["engine"] == "embedded" and row["steps"] == 2 and row["eval_sessions"] == 4
    assert 0.0 <= row["before"] <= 1.0 and 0.0 <= row["after"] <= 1.0
    assert row["delta_points"] == pytest.approx(100 * (row["after"] - row["before"]), abs=0.06)
    assert row["sampled_tokens"] > 0 and row["tokens_per_s"] > 0 and row["collect_s"] > 0
    assert row["wall_s"] >= row["collect_s"] + row["learn_s"] + row["sync_s"]
    assert row["calls_per_session"] >= 2  # the harness asks twice: the question, then for the bare number
    assert len(row["per_step"]) == 2 and all(0.0 <= s["signal_share"] <= 1.0 for s in row["per_step"])
    text = bench.table([row])
    assert text.splitlines()[0].startswith("| engine | before | after | delta (pts)")
    assert "| embedded |" in text and "collection bound" in text and "learning bound" in text and "sync bound" in text
