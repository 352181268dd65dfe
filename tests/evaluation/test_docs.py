"""The suite docs/evaluation.md shows validates as written."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from polar.config.base import validate
from polar.evaluation.suite import EvalSuite

DOC = Path(__file__).resolve().parents[2] / "docs" / "evaluation.md"


def test_the_documented_suite_validates():
    blocks = [yaml.safe_load(m) for m in re.findall(r"```ya?ml\n(.*?)```", DOC.read_text(), re.S)]
    suites = [b for b in blocks if isinstance(b, dict) and "harnesses" in b]
    assert suites
    for data in suites:
        suite = validate(EvalSuite, data, source="docs/evaluation.md")
        assert suite.policies_for(suite.harnesses[0])
