"""docs/agentic.md documents the agent-run config as the pydantic models define it.

The page's example config validates as an agent run; its GRPO/SFT kwargs tables list exactly the models'
fields with their defaults; the model table lists ModelConfig's keys and the launcher's engine_kwargs with
their defaults; every verifier type and kwarg it names exists.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from polar.config.agentic import VERIFIER_TYPES, ModelConfig
from polar.config.base import validate
from polar.config.grpo import GRPOKwargs, SFTKwargs
from polar.config.run import AgentRunConfig, RunConfig

DOC = (Path(__file__).resolve().parents[2] / "docs" / "agentic.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end != -1 else None]


def _tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of ``text``: rows of cells, header and separator dropped."""
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))])
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


def _shown(value: Any) -> str:
    """A default as the tables write it."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _default(model: Any, name: str) -> Any:
    field = model.model_fields[name]
    return field.default_factory() if field.default_factory is not None else field.default


def test_the_example_config_is_a_valid_agent_run():
    block = re.search(r"```yaml\n(.*?)```", DOC, re.S)
    assert block, "docs/agentic.md has no yaml example"
    cfg = validate(RunConfig, yaml.safe_load(block.group(1)), source="docs/agentic.md")
    assert isinstance(cfg, AgentRunConfig) and cfg.policy.type == "grpo"


@pytest.mark.parametrize("index, model", [(0, GRPOKwargs), (1, SFTKwargs)])
def test_kwargs_tables_list_every_field_with_its_default(index, model):
    rows = _tables(_section("GRPO and SFT kwargs"))[index]
    documented = {row[0].strip("`"): row[1] for row in rows}
    assert list(documented) == list(model.model_fields), f"{model.__name__}: the table's keys differ from the model's"
    for name, shown in documented.items():
        assert shown == _shown(_default(model, name)), (model.__name__, name, shown)


def test_model_table_lists_model_config_and_the_launcher_defaults():
    from polar.inference.vllm_launcher import VllmLaunchConfig

    (rows,) = _tables(_section("The model"))
    documented = {row[0].strip("`"): row for row in rows}
    assert set(documented) == set(ModelConfig.model_fields)
    for name, row in documented.items():
        assert row[1] == _shown(_default(ModelConfig, name)), name
    launcher = documented["engine_kwargs"][2]
    for key, shown in re.findall(r"`(\w+)` \((`[\w.]+`|[\d.]+)[) ]", launcher):
        assert key in VllmLaunchConfig.model_fields, key
        assert yaml.safe_load(shown.strip("`")) == _default(VllmLaunchConfig, key), (key, shown)
    named = set(re.findall(r"`(\w+)`(?! ?\))", launcher.split("(`polar.inference")[0]))  # keys, not (defaults)
    assert named - {"max_batch_size"} <= set(VllmLaunchConfig.model_fields), named


def test_verifier_table_names_real_types_and_kwargs():
    from polar.harness.agent.verifiers import _BUILTIN

    (rows,) = _tables(_section("Verifiers"))
    seen = set()
    for row in rows:
        types = re.findall(r"`([^`]+)`", row[0])
        for kind in types:
            assert kind in VERIFIER_TYPES or kind == '"module:function"', kind
            seen.add(kind)
        if len(types) == 1 and types[0] in _BUILTIN:
            params = set(inspect.signature(_BUILTIN[types[0]]).parameters)
            for name in re.findall(r"`(\w+)(?:: [^`]*)?`", row[2]):
                assert name in params, (types[0], name)
    assert set(VERIFIER_TYPES) <= seen, set(VERIFIER_TYPES) - seen
