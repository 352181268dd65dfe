"""The sums task family: "What is A plus B?" for A, B in 1..20, generated from a seed, and its verifier.

Tasks come from ``tasks: {source: seeds, ...}``: each task is ``{"seed": N, ...}`` and the question is a pure
function of the seed (:func:`problem`). The 400 ordered pairs are split once, by a fixed rule, into
325 training pairs and 75 held-out pairs (:func:`is_heldout_pair`); seeds from ``HELDOUT_START`` on draw from the
held-out pairs only, so held-out questions are never trained on (disjoint seeds *and* disjoint problems).

The verifier scores the harness's output (one line per model reply, the final reply last):

- held-out seeds: **exact success**, 1.0 only when the final reply is the sum and nothing else (surrounding
  whitespace, ``**`` and one trailing period allowed), else 0.0;
- training seeds (``partial_credit: true``): 1.0 for an exact answer, else partial credit that gives GRPO a
  signal while exact answers are rare: 0.5 for a bare (wrong) integer as the final reply, 0.1 when the final reply
  holds the sum among other words, 0.05 when only an earlier reply did. The bare format scores far above a wordy
  right answer on purpose. SmolLM2 gives a wordy right answer about five times as often as a bare one, and
  GRPO follows the frequent signal: with 0.5 for wordy-right and 0.2 for bare it settled on "A + B equals C."
  within three steps, and with 0.2 wordy-right and 0.3 bare it still drifted to wordy answers over nine steps
  (held-out exact success 0.000 -> 0.060).
"""

from __future__ import annotations

import random
import re

LOW, HIGH = 1, 20
HELDOUT_START = 1_000_000  # seeds from here on are held-out questions (eval_tasks.start in the configs)


def is_heldout_pair(a: int, b: int) -> bool:
    """About a fifth of the 400 ordered pairs, picked by a fixed pseudo-random rule."""
    return random.Random(1000 * a + b).random() < 0.2


TRAIN_PAIRS = [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1) if not is_heldout_pair(a, b)]
HELDOUT_PAIRS = [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1) if is_heldout_pair(a, b)]


def problem(seed: int) -> tuple[int, int]:
    """The pair ``(a, b)`` of task ``seed``: a training pair below ``HELDOUT_START``, a held-out one from it."""
    pairs = HELDOUT_PAIRS if seed >= HELDOUT_START else TRAIN_PAIRS
    return random.Random(seed).choice(pairs)


def question(seed: int) -> str:
    a, b = problem(seed)
    return f"What is {a} plus {b}?"


_INT = re.compile(r"-?\d+")


def _bare(text: str) -> str:
    t = text.strip().strip("*").strip()
    return t[:-1].strip() if t.endswith(".") else t


def verify(task: dict, output: str, partial_credit: bool = True) -> dict:
    a, b = problem(int(task["seed"]))
    answer = a + b
    replies = [ln for ln in output.splitlines() if ln.strip()]
    final = replies[-1] if replies else ""
    exact = _bare(final) == str(answer)
    heldout = int(task["seed"]) >= HELDOUT_START
    if exact or heldout or not partial_credit:
        reward = float(exact)
    else:
        if re.fullmatch(r"-?\d+", _bare(final)):
            reward = 0.5  # the format asked for, a wrong number
        elif str(answer) in _INT.findall(final):
            reward = 0.1  # the right number among other words
        elif any(str(answer) in _INT.findall(r) for r in replies[:-1]):
            reward = 0.05
        else:
            reward = 0.0
    return {"reward": reward, "exact": float(exact), "expected": answer, "got": final[:80]}
