from __future__ import annotations

from pathlib import Path

import pytest

from polar.config.harness import ConnectorSpec

CONNECTORS_DIR = Path(__file__).parent / "connectors"
KEYDOOR_DIR = Path(__file__).resolve().parents[2] / "examples" / "keydoor"


def make_spec(class_name: str, module: str = "sample_connectors", **kw) -> ConnectorSpec:
    """A spec for a test connector with short backoff and no heartbeat (tests must stop by themselves).

    ``call_timeout_s`` is the library default (30 s): every reply here is expected to arrive, and a loaded
    machine (a connector's first compressed frame, a cold import) must not read as a hang and add a restart.
    Tests of the hang path set their own short one."""
    base = dict(module=module, class_name=class_name, call_timeout_s=30.0, start_timeout_s=30.0,
                restart_backoff_s=0.05, heartbeat_interval_s=0)
    base.update(kw)
    return ConnectorSpec(**base)


@pytest.fixture
def connectors_dir() -> Path:
    return CONNECTORS_DIR
