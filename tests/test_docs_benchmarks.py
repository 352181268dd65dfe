"""docs/benchmarks.md is one current section per benchmark, and every command it shows still runs as written.

Each ``## `` section has its five parts in order (What, Command, Machine, a table, Reading); every
``benchmarks/*.py`` flag a command passes is one that script (or a shared ``benchmarks/_*.py`` helper) defines;
every ``polar run --config FILE -o KEY=VALUE`` loads with those overrides. That every path and file name on the
page is in the repository is tests/test_docs_map.py's check."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from polar.config import load_config

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "benchmarks.md").read_text()
PARTS = ("**What.**", "**Command.**", "**Machine.**", "TABLE", "**Reading.**")


def _sections() -> dict[str, str]:
    chunks = re.split(r"^## (.+)$", PAGE, flags=re.M)
    return {chunks[i].strip(): chunks[i + 1] for i in range(1, len(chunks) - 1, 2)}


def _commands() -> list[str]:
    """Every command on the page: the logical lines of fenced blocks (``\\`` continuations joined), then every
    inline code span (they may wrap across lines)."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", PAGE, flags=re.S | re.M)
    out = [line for block in fenced for line in block.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", PAGE, flags=re.S | re.M)
    out += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    return [c for c in out if c.strip() and not c.lstrip().startswith("#")]


def _words(command: str) -> list[str]:
    cleaned = command.replace("[", " ").replace("]", " ").replace(";", " ").replace("$s", "0")
    try:
        return shlex.split(cleaned)
    except ValueError:
        return cleaned.split()


SECTIONS = _sections()


def test_the_page_has_its_sections():
    assert len(SECTIONS) >= 20, sorted(SECTIONS)
    assert len(set(SECTIONS)) == len(SECTIONS)


@pytest.mark.parametrize("title", sorted(SECTIONS))
def test_every_section_has_what_command_machine_table_reading_in_order(title):
    body = SECTIONS[title]
    table = re.search(r"^\|\s*:?-{3,}", body, flags=re.M)
    where = {part: (table.start() if table else -1) if part == "TABLE" else body.find(part) for part in PARTS}
    missing = [p if p != "TABLE" else "a table" for p, i in where.items() if i < 0]
    assert not missing, f"docs/benchmarks.md, section {title!r}, lacks {missing}"
    order = sorted(where, key=where.__getitem__)
    assert order == list(PARTS), f"docs/benchmarks.md, section {title!r}: parts in the order {order}, want {list(PARTS)}"


def _script_flags() -> list[tuple[str, str]]:
    pairs = []
    for command in _commands():
        words = _words(command)
        for i, w in enumerate(words):
            m = re.fullmatch(r"(?:\S*/)?(benchmarks/[\w/]+\.py)", w)
            if not m:
                continue
            for flag in words[i + 1:]:
                if re.fullmatch(r"benchmarks/[\w/]+\.py", flag) or flag in ("&&", "|", ">"):
                    break
                if re.fullmatch(r"--[a-z][\w-]*", flag.split("=", 1)[0]):
                    pairs.append((m.group(1), flag.split("=", 1)[0]))
    return sorted(set(pairs))


SCRIPT_FLAGS = _script_flags()


def test_the_pages_script_commands_are_found():
    assert len({s for s, _ in SCRIPT_FLAGS}) >= 15, SCRIPT_FLAGS


@pytest.mark.parametrize("script, flag", SCRIPT_FLAGS, ids=[f"{s}:{f}" for s, f in SCRIPT_FLAGS])
def test_every_flag_a_benchmark_command_passes_is_defined_by_its_script(script, flag):
    path = ROOT / script
    assert path.exists(), f"docs/benchmarks.md runs {script}, which is not in the repository"
    sources = [path.read_text()] + [p.read_text() for p in (ROOT / "benchmarks").glob("_*.py")]
    assert any(f'"{flag}"' in src for src in sources), (
        f"docs/benchmarks.md runs {script} with {flag}, which the script does not define (renamed or removed?)")


def _run_commands() -> list[tuple[str, tuple[str, ...]]]:
    runs = []
    for command in _commands():
        words = _words(command)
        for i in range(len(words) - 3):
            if words[i:i + 3] == ["polar", "run", "--config"]:
                config = words[i + 3]
                overrides = tuple(words[j + 1] for j in range(i + 4, len(words) - 1) if words[j] in ("-o", "--override"))
                runs.append((config, overrides))
    return sorted(set(runs))


RUNS = _run_commands()


def test_the_pages_polar_run_commands_are_found():
    assert len(RUNS) >= 4, RUNS


@pytest.mark.parametrize("config, overrides", RUNS, ids=[" ".join((c, *o)) for c, o in RUNS])
def test_every_polar_run_command_loads_its_config_with_its_overrides(config, overrides):
    assert (ROOT / config).exists(), f"docs/benchmarks.md runs `polar run --config {config}`, which is not shipped"
    load_config(ROOT / config, list(overrides))  # a missing key, a renamed kwarg or a bad value raises, naming it


def _cells(row: str) -> int:
    return re.sub(r"`[^`]*`", "", row).count("|") - 1


def test_every_table_row_has_as_many_cells_as_its_header():
    lines = PAGE.splitlines()
    bad = []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and re.match(r"^\|\s*:?-{3,}", lines[i + 1]) and not lines[i - 1].startswith("|"):
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                if _cells(lines[j]) != _cells(line):
                    bad.append(f"line {j + 1}: {_cells(lines[j])} cells, header {_cells(line)}")
                j += 1
    assert not bad, f"docs/benchmarks.md: table rows that break their table: {bad}"
