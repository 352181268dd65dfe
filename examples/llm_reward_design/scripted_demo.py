"""The reward designer offline: a scripted engine proposes three known rewards for CartPole.

    python examples/llm_reward_design/scripted_demo.py

One is good (+1 per step the pole stays up), one is bad (-1 per step: the agent learns to fall fast), one
crashes. Each trains a short PPO run with its reward computed in bubblewrap; the good one is kept by
CartPole's own return. Swap the scripted engine for any polar engine (e.g. ``engine: openai_compat``, see
cartpole_hosted.yaml and docs/llm-roles.md) to let a real model write them.
"""

from __future__ import annotations

import asyncio
import logging

from polar.inference.chat import chat_function
from polar.inference.scripted import ScriptedEngine
from polar.llm_roles.reward_design import RewardDesignConfig, design_reward

HEAD = "def compute_reward(obs, action, next_obs, terminated, truncated):\n"
GOOD = f"Reward staying up.\n```python\n{HEAD}    return 0.0 if terminated else 1.0\n```"
BAD = f"```python\n{HEAD}    return -1.0\n```"
CRASH = f"```python\n{HEAD}    return obs['angle']  # obs is a list: TypeError\n```"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    engine = ScriptedEngine.tiny([GOOD, BAD, CRASH])
    cfg = RewardDesignConfig(env_id="CartPole-v1", description="balance a pole on a cart; +1 per step upright",
                             rounds=1, candidates_per_round=3, total_env_steps=4096)
    result = asyncio.run(design_reward(cfg, chat_function(engine, max_tokens=256), on_candidate=lambda c: logging.info(
        "candidate %d: %s", c.index, f"score {c.score:.1f}" if c.score is not None else f"failed: {c.error}")))
    assert result.best is not None, "every candidate failed"
    logging.info("kept candidate %d (score %.1f):\n%s", result.best.index, result.best.score or 0.0, result.best.code)


if __name__ == "__main__":
    main()
