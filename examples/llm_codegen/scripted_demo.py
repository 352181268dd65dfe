"""The code generator offline: a scripted engine writes a broken connector, then the fixed one.

    python examples/llm_codegen/scripted_demo.py

The first connector declares a 3-float observation but returns 4 floats; ``polar check`` (run in
bubblewrap) says so, that output goes back to the engine, and its second reply passes. With a real model
(``engine: openai_compat``, docs/llm-roles.md) the replies are written, not scripted.
"""

from __future__ import annotations

import asyncio
import logging

from polar.inference.chat import chat_function
from polar.inference.scripted import ScriptedEngine
from polar.llm_roles.codegen import generate_connector

CONNECTOR = '''```python
import numpy as np
from gymnasium import spaces


class GeneratedConnector:
    """A counter: 2 actions, a 3-float observation, 10 steps an episode."""

    action_space = spaces.Discrete(2)
    observation_space = spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)

    def __init__(self, config):
        self.t = 0

    def reset(self, seed=None):
        self.t = 0
        return np.zeros(SIZE, dtype=np.float32)

    def step(self, action):
        self.t += 1
        return np.full(SIZE, self.t / 10, dtype=np.float32), float(action), self.t >= 10, False, {}

    def close(self):
        pass
```'''


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    engine = ScriptedEngine.tiny([CONNECTOR.replace("SIZE", "4"), CONNECTOR.replace("SIZE", "3")])
    result = asyncio.run(generate_connector("a counter env: 2 actions, 3-float observation in [0, 1], 10 steps",
                                            chat_function(engine, max_tokens=512), max_attempts=3))
    for a in result.attempts:
        logging.info("attempt %d: %s\n%s", a.index, "passed" if a.passed else "failed", a.output[-600:])
    assert result.passed is not None and result.folder is not None, "no connector passed polar check"
    logging.info("kept %s", result.folder / "generated_connector.py")


if __name__ == "__main__":
    main()
