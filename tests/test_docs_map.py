"""The README is the map (every command, every docs page), and docs/benchmarks.md names only files that exist:
each repository path it cites, each script or config it ran."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from polar.cli.main import SUBCOMMANDS
from polar.config import load_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BENCHMARKS = (ROOT / "docs" / "benchmarks.md").read_text()
TOP = ("polar", "examples", "benchmarks", "tests", "docs", ".ci")


def _tracked() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_readme_names_every_command(command):
    assert f"`polar {command}" in README, f"README.md does not show `polar {command}`"


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_readme_links_every_docs_page(page):
    assert f"docs/{page}" in README, f"README.md's documentation table leaves out docs/{page}"


def test_readme_says_which_engine_on_which_machine():
    assert "Which engine on which machine" in README and "smollm2-135m" in README


def test_gateway_help_names_every_model_kind():
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "gateway", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert "sglang:URL" in " ".join(p.stdout.split()), p.stdout


def test_every_repository_path_in_benchmarks_exists():
    top = "|".join(map(re.escape, TOP))
    paths = {m.rstrip(".,:;)") for m in re.findall(rf"(?<![\w/.$-])((?:{top})/[\w./-]*\w)", BENCHMARKS)}
    assert len(paths) > 20  # the pattern finds what the page cites
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/benchmarks.md names paths that are not in the repository: {missing}"


def test_every_script_config_and_page_named_in_benchmarks_is_shipped():
    """Bare names too (`gateway_overhead.py`, a config a run used, a notes page): each is a tracked file."""
    names = set(re.findall(r"(?<![\w/.-])([\w-]+\.(?:py|ya?ml|md))\b", BENCHMARKS))
    tracked = {Path(p).name for p in _tracked()}
    missing = sorted(n for n in names if n not in tracked)
    assert not missing, f"docs/benchmarks.md names files that are not in the repository: {missing}"


@pytest.mark.parametrize("config", sorted((ROOT / "benchmarks" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_benchmark_configs_are_valid(config):
    from polar.trainers.preflight import check_before_start

    check_before_start(load_config(config))
