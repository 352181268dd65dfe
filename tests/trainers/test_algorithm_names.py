"""Algorithm names live in registry rows and config models only, and ``trainers/`` has one loop class.

Read from the package's source (its syntax trees, not a text grep, so messages and docstrings that name an
algorithm are fine): a comparison with ``policy.type`` or with an algorithm's name, a dict key or a subscript
that is an algorithm's name, anywhere but ``polar/config/`` and ``polar/trainers/registry.py``, is a place
that chooses by algorithm name, which is the registry's job.
"""

from __future__ import annotations

import ast
from pathlib import Path

import polar
from polar.config.run import AGENT_POLICIES, ENV_POLICIES

PACKAGE = Path(polar.__file__).parent
ALGORITHMS = set(ENV_POLICIES) | set(AGENT_POLICIES)
ALLOWED = ("config/", "trainers/registry.py")


def _is_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ALGORITHMS


def _is_policy_type(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "type" and isinstance(node.value, ast.Attribute)
            and node.value.attr == "policy")


def _names(node: ast.AST) -> bool:
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_name(e) for e in node.elts)
    return _is_name(node)


def choices_by_name(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each place in ``tree`` that chooses by an algorithm's name."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            if any(_is_policy_type(p) for p in parts):
                out.append((node.lineno, "compares policy.type"))
            elif any(_names(p) for p in parts):
                out.append((node.lineno, "compares with an algorithm name"))
        elif isinstance(node, ast.Dict) and any(k is not None and _is_name(k) for k in node.keys):
            out.append((node.lineno, "keys a dict by algorithm name"))
        elif isinstance(node, ast.Subscript) and _is_name(node.slice):
            out.append((node.lineno, "indexes by algorithm name"))
    return out


def test_the_scan_finds_each_way_of_choosing_by_name():
    code = ('if cfg.policy.type == "ppo": pass\nif kind in ("dqn", "sac"): pass\n'
            'HIDDEN = {"sac": [256]}\nx = HIDDEN["sac"]\nlog.info("ppo trains %s", cfg.policy.type)\n')
    assert [line for line, _ in choices_by_name(ast.parse(code))] == [1, 2, 3, 4]


def test_no_algorithm_name_outside_registry_rows_and_config_models():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(ALLOWED):
            continue
        found += [f"polar/{rel}:{line}: {what}" for line, what in choices_by_name(ast.parse(path.read_text()))]
    assert found == [], "choose by the registry row or a config model's type instead:\n" + "\n".join(found)


def test_trainers_has_one_loop_class_final_and_without_subclasses():
    from polar.trainers.loop import TrainingLoop

    assert getattr(TrainingLoop, "__final__", False)  # typing.final
    bases: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "trainers").glob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[f"{rel}:{node.name}"] = [ast.unparse(b) for b in node.bases]
    loops = [name for name, b in bases.items() if name.endswith(":TrainingLoop")]
    assert loops == ["trainers/loop.py:TrainingLoop"]
    assert [name for name, b in bases.items() if any("TrainingLoop" in x for x in b)] == []
