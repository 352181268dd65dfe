"""Verifiers for the GRPO sampling tests (``module:function``): rewards chosen by the task, and bad ones."""


def by_kind(task, records):
    """A reward chosen by the task's ``kind``: flat 0, easy 1, half 0.5, mixed the first sampled token's parity
    (differs within a group of 8 almost surely), nan and over (2.0) the bad rewards a broken verifier returns."""
    kind = task.get("kind", "mixed")
    fixed = {"flat": 0.0, "easy": 1.0, "half": 0.5, "nan": float("nan"), "over": 2.0}
    if kind in fixed:
        return fixed[kind]
    return float(records[-1].sampled_ids[0] % 2 == 0)


def solved(output):
    """Every session succeeds: a curriculum's pass rate reaches any threshold."""
    return 1.0
