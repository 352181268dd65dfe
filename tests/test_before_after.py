"""benchmarks/before_after.py --quick: both sides run every measurement through their CLI, one table and one JSON
come out with a number per side for each of issue 34's five rows, and the temporary worktree is gone afterwards.
No timing is asserted (the box is shared); the full run is the lead's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADLINE = ("ppo_cpu_s_to_475", "dqn_cpu_s", "sac_cpu_s", "gateway_rps_c1", "grpo_s_per_step")
BENCHES = ("ppo", "dqn", "sac", "gateway", "grpo")


def _worktrees() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "worktree", "list", "--porcelain"], capture_output=True, text=True,
                          check=True).stdout


def test_quick_before_after_prints_both_sides_of_every_row_and_writes_the_json(tmp_path):
    out = tmp_path / "ba.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "before_after.py"), "--quick", "--before", "HEAD",
                        "--json", str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-4000:]

    header = "| metric | before | after | after / before | cost ratio (<= 1.05) | better |"
    assert header in p.stdout, p.stdout
    for metric in HEADLINE:  # a row with a number on each side
        row = next((line for line in p.stdout.splitlines() if line.startswith(f"| **{metric}** |")), None)
        assert row is not None, f"{metric} missing from the table:\n{p.stdout}"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[2]) > 0, row

    data = json.loads(out.read_text())
    assert data["quick"] is True and data["repeats"] == 1 and data["failures"] == []
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert data["sides"]["before"]["commit"] == head and data["sides"]["before"]["source"] == "ref HEAD"
    assert data["sides"]["after"]["source"] == "working tree" and data["sides"]["after"]["tree"] == str(ROOT)
    ran = {(t["bench"], t["side"]) for t in data["trials"]}
    assert ran == {(b, s) for b in BENCHES for s in ("before", "after")}, ran
    summary = {r["metric"]: r for r in data["summary"]}
    for metric in HEADLINE:
        assert summary[metric]["before"] > 0 and summary[metric]["after"] > 0, summary[metric]
        assert summary[metric]["cost_ratio"] is not None, summary[metric]
    # the tiny config's groups carry signal, so GRPO steps update the weights on both sides (not only skips)
    assert all(t["grpo_updates"] >= 1 for t in data["trials"] if t["bench"] == "grpo"), data["trials"]
    # the before side ran from its own worktree, and that worktree is removed
    before_tree = data["sides"]["before"]["tree"]
    assert before_tree != str(ROOT) and not Path(before_tree).exists()
    assert f"worktree {before_tree}\n" not in _worktrees()  # other worktrees of the repository may come and go
