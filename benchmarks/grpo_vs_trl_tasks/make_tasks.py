"""The task files of benchmarks/grpo_vs_trl.py: reasoning-gym families at their default difficulty, as plain
JSONL (``id``, ``prompt``, ``answer``), so both sides read the same file and neither needs reasoning-gym.

    .venv/bin/python benchmarks/grpo_vs_trl_tasks/make_tasks.py     # rewrites the four files next to it

Deterministic: train items come from seeds 0.., held-out ones from seeds 1_000_000.. (disjoint). The prompt is
the dataset's own question, nothing added: nobody at polar shaped it.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = ("chain_sum", "leg_counting", "letter_counting")
TRAIN, HELDOUT = 1000, 300
HELDOUT_SEED = 1_000_000


def rows(name: str, size: int, seed: int) -> list[dict[str, str]]:
    import reasoning_gym

    ds = reasoning_gym.create_dataset(name, size=size, seed=seed)
    return [{"id": f"{name}-{seed + i}", "prompt": ds[i]["question"], "answer": str(ds[i]["answer"])} for i in range(size)]


def main() -> None:
    for name in FAMILIES:
        for split, size, seed in (("train", TRAIN, 0), ("heldout", HELDOUT, HELDOUT_SEED)):
            path = HERE / f"{name}_{split}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows(name, size, seed)))


if __name__ == "__main__":
    main()
