"""The planner example: an engine writes the subgoals, then PPO trains the goal-conditioned controller.

    python examples/llm_planner/run.py [--steps 200000] [-- extra `polar run` arguments]

The engine here is scripted (offline, deterministic); to let a hosted model plan, build it with
``polar.inference.loading.load_engine(MODEL, engine="openai_compat", base_url=..., api_key_env=...)``
(docs/llm-roles.md). The plan goes to the controller's env as text (``harness.kwargs.plan``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from planned_keydoor import DESCRIPTION, VOCABULARY

from polar.inference.chat import chat_function
from polar.inference.scripted import ScriptedEngine
from polar.llm_roles.planner import make_plan

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("rest", nargs="*")
    args = p.parse_args()
    engine = ScriptedEngine.tiny(["Plan:\n1. Walk through the gap and step onto the key.\n2. Walk into the door."])
    plan = asyncio.run(make_plan(chat_function(engine, max_tokens=64), DESCRIPTION, VOCABULARY))
    text = "\n".join(plan)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "polar.cli.main", "run", "--config", str(HERE / "controller_ppo.yaml"),
           "-o", f"harness.kwargs.plan={json.dumps(text)}", "-o", f"total_env_steps={args.steps}", *args.rest]
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
