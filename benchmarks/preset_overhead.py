"""What polar's preset runner and sandbox add to a coding-CLI run.

The same CLI, the same env/config (the preset's), the same task and the same recording endpoint
(which first answers with a shell tool call, then with text: two model calls and one tool run)
are run in three ways:

- **direct**: the CLI as a plain subprocess (the peer: what a user would do by hand);
- **polar, runtime none**: ``PresetRunner`` without a container (workspace copy + git baseline,
  limits, kill-all, diff and transcript collection);
- **polar, bwrap**: ``PresetRunner`` in bubblewrap as ``nobody`` with the network limited to the
  endpoint through the two relays.

    OMP_NUM_THREADS=1 python benchmarks/preset_overhead.py --preset pi codex --rounds 3

Rounds are interleaved; the median wall time per row is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polar.harness.agent.presets import PresetContext, get_preset  # noqa: E402
from polar.harness.agent.presets.runner import PresetRunner  # noqa: E402
from polar.harness.agent.runners import SessionContext  # noqa: E402
from tests.harness.agent.presets.capture_server import CaptureServer  # noqa: E402

TASK = json.loads((ROOT / "examples" / "swe_mini" / "tasks.jsonl").read_text().splitlines()[0])
REPO = ROOT / "examples" / "swe_mini" / TASK["repo"]


def direct(name: str, url: str, tmp: Path) -> float:
    ws = tmp / "ws"
    shutil.copytree(REPO, ws)
    ctx = PresetContext("bench", url, "tiny", TASK["instruction"], ws, tmp / "home", {"compact": True})
    spec = get_preset(name).launch(ctx)
    t = time.perf_counter()
    subprocess.run(spec.argv, cwd=spec.cwd, env=spec.env, stdin=subprocess.DEVNULL, capture_output=True,
                   timeout=300, check=True, start_new_session=True)
    return time.perf_counter() - t


def polar(name: str, url: str, tmp: Path, runtime: str) -> float:
    runner = PresetRunner(get_preset(name), {"compact": True, "sandbox": {"runtime": runtime}})
    task = {**TASK, "repo": str(REPO)}
    ctx = SessionContext("bench", task, tmp / "ws", url, "bench", model="tiny")
    t = time.perf_counter()
    out = asyncio.run(runner.run(ctx, 300, asyncio.Event()))
    elapsed = time.perf_counter() - t
    if out.error or not out.details.get("diff"):
        raise RuntimeError(f"{name} ({runtime}) failed: {out.error}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", nargs="+", default=["pi"])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name in args.preset:
        times: dict[str, list[float]] = {"direct": [], "polar (runtime none)": [], "polar (bwrap, gateway-only)": []}
        for _ in range(args.rounds):
            for label in times:
                server = CaptureServer(tool_first=True)
                url = server.start()
                tmp = Path(tempfile.mkdtemp(prefix="bench-preset-"))
                try:
                    if label == "direct":
                        times[label].append(direct(name, url, tmp))
                    else:
                        times[label].append(polar(name, url, tmp, "none" if "none" in label else "bwrap"))
                    assert len([r for r in server.requests if r["method"] == "POST"]) >= 2
                finally:
                    server.stop()
                    shutil.rmtree(tmp, ignore_errors=True)
        base = statistics.median(times["direct"])
        for label, ts in times.items():
            med = statistics.median(ts)
            rows.append((name, label, med, med / base))
    print(f"{'preset':<12} {'how':<30} {'median s':>9} {'vs direct':>10}")
    for name, label, med, ratio in rows:
        print(f"{name:<12} {label:<30} {med:>9.2f} {ratio:>9.2f}x")


if __name__ == "__main__":
    main()
