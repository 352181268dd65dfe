"""docs/security.md links every promise to its test: each test it names must exist, so a renamed or deleted
attack test cannot leave the page promising what nothing checks any more."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"


def _defined_tests() -> dict[str, set[str]]:
    """test function name -> the test files (relative paths) that define it."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        for name in re.findall(r"^\s*(?:async\s+)?def\s+(test_\w+)\s*\(", path.read_text(), flags=re.M):
            found.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_every_test_named_in_security_md_exists() -> None:
    text = DOC.read_text()
    defined = _defined_tests()
    named = set(re.findall(r"\b(test_\w+)", text))
    assert len(named) >= 60, f"docs/security.md names only {len(named)} tests; every promise names its test"
    missing = sorted(n for n in named if n not in defined and not (ROOT / "tests").joinpath(n).exists()
                     and not any(p.endswith(f"/{n}.py") for ps in defined.values() for p in ps))
    modules = {Path(p).stem for ps in defined.values() for p in ps}
    missing = [n for n in missing if n not in modules]
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"


def test_every_file_named_in_security_md_exists() -> None:
    text = DOC.read_text()
    paths = set(re.findall(r"`((?:tests|polar|examples|docs)/[\w./-]+\.(?:py|md|yaml))", text))
    paths |= {m for m in re.findall(r"((?:tests|polar)/[\w/]+\.py)::", text)}
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/security.md names files that do not exist: {missing}"


def test_every_attack_test_file_is_linked_from_security_md() -> None:
    text = DOC.read_text()
    files = sorted(p.name for p in (ROOT / "tests" / "security").glob("test_*.py") if p.name != Path(__file__).name)
    unlinked = [f for f in files if f not in text]
    assert not unlinked, f"tests/security files not named in docs/security.md: {unlinked}"
