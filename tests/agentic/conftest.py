import psutil
import pytest

from tests.agentic.helpers import alive, oracle_script


@pytest.fixture
def oracle_engine():
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    return ScriptedEngine.tiny(oracle_script(tok))

@pytest.fixture
def no_leftovers():
    """Fail if a test leaves any new descendant of this process running."""
    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    yield
    after = [c for c in me.children(recursive=True) if c.pid not in before and alive(c.pid)]
    assert not after, f"processes left running: {[(p.pid, p.cmdline()) for p in after]}"
