"""How `make test` splits the suite over two pytest-xdist workers (`-n 2 --dist loadgroup`).

A work unit is one test file, so a module-scoped fixture (a trained run, a started gateway) is built once.
Tests that share a session-wide resource form one unit each, run in collection order on one worker: the one
vLLM replica (`vllm`-marked tests and users of ``launched_vllm``), the one two-node Ray cluster (`ray`-marked
tests and users of ``ray_cluster``), the one `make harnesses` install (the coding-agent CLI tests, marker
`cli`). So the workers never build a second shared replica or cluster, and vLLM starts never overlap: CI's 2
cores hold at most the vLLM servers a one-process run holds.

xdist's own `loadgroup` reads ``xdist_group`` marks by rewriting ``item._nodeid``, which pytest 9.2 no longer
reads (node ids are ``item._id``); so the workers write each test's unit to a file at the end of collection and
this scheduler (xdist's LoadScopeScheduling, larger units first) reads it. Imported by tests/conftest.py.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

SHARED_GROUPS = (("vllm", ("launched_vllm",)), ("ray", ("ray_cluster",)), ("cli", ("cli",)))


def unit_of(item: pytest.Item) -> str:
    """The work unit of ``item``: a shared-resource group, else its file."""
    names = getattr(item, "fixturenames", ())  # pytest.Function's; other items (doctests) have none
    for group, fixtures in SHARED_GROUPS:
        if item.get_closest_marker(group) is not None or any(f in names for f in fixtures):
            return group
    return item.nodeid.split("::")[0]


def _units_file(workerinput: dict[str, Any]) -> Path:
    return Path(tempfile.gettempdir()) / f"polar-xdist-units-{workerinput['testrunuid']}-{workerinput['workerid']}.json"


@pytest.hookimpl(tryfirst=True)  # before the worker reports its collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None or not getattr(session.config.option, "loadgroup", False):
        return
    _units_file(workerinput).write_text(json.dumps({item.nodeid: unit_of(item) for item in session.items}))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedResourceScheduling(LoadScopeScheduling):  # type: ignore[misc]
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # every worker has collected (and written its file) by the first call
                self.units = {}
                for node in self.nodes:  # a missing file (a worker that died collecting): its tests go by file
                    path = _units_file(node.workerinput)
                    if path.is_file():
                        self.units.update(json.loads(path.read_text()))
                        path.unlink()
            return self.units.get(nodeid, nodeid.split("::")[0])

    return SharedResourceScheduling(config, log)
