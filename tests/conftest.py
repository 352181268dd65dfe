import os

import pytest

# `make test` runs on two pytest-xdist workers; these hooks keep each file, and each session-wide resource
# (vLLM replica, Ray cluster, coding-CLI install), on one worker (tests/xdist_groups.py)
from tests.xdist_groups import pytest_collection_finish, pytest_xdist_make_scheduler  # noqa: F401

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


# ---- one small two-node Ray cluster per test session (2 logical CPUs per node, no dashboard) -------------
@pytest.fixture(scope="session")
def ray_cluster():
    """Shared by every test that names it (tests/distributed, tests/trainers, tests/rollout)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    node_args = {"num_cpus": 2, "object_store_memory": 150 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", include_dashboard=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


# ---- a real vLLM CPU server, launched once per test session through polar's own launcher ----------------
@pytest.fixture(scope="session")
def vllm_model_folder():
    """The folder every real-vLLM test serves: the smollm2-135m preset (converted once into polar's cache)."""
    from polar.inference.vllm_launcher import resolve_model_folder

    return resolve_model_folder(os.environ.get("POLAR_TEST_VLLM_MODEL", "smollm2-135m"))


@pytest.fixture(scope="session")
def launched_vllm(vllm_model_folder, tmp_path_factory):
    """One polar-launched vLLM replica shared by every test marked ``vllm`` (a start costs tens of seconds).

    ``enforce_eager`` skips vLLM's compilation (about 25 s to start instead of 2-3 min on 2 cores); tests that
    kill the replica leave it restarted. At the end the fixture checks that closing left no vLLM process."""
    import asyncio

    from polar.errors import PolarError
    from polar.inference.vllm_launcher import launch_vllm

    try:
        engine = launch_vllm(str(vllm_model_folder), replicas=1, log_dir=tmp_path_factory.mktemp("vllm-logs"),
                             enforce_eager=True, max_model_len=2048)
    except PolarError as exc:
        pytest.fail(f"{exc} (the real-vLLM tests need `make vllm`; deselect them with -m 'not vllm')", pytrace=False)
    yield engine
    groups = [r.proc.pid for r in engine.fleet.replicas if r.proc is not None]
    asyncio.run(engine.close())
    from tests.vllm_util import live_group_members

    assert not any(live_group_members(g) for g in groups), "vLLM processes outlived engine.close()"


# ---- agent runs (tests/agent_support holds the agents, verifiers and helpers they share) --------------------
@pytest.fixture
def oracle_engine():
    """A ScriptedEngine over the tiny model that answers the calculator tasks right (tests.agent_support.helpers)."""
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer
    from tests.agent_support.helpers import oracle_script

    return ScriptedEngine.tiny(oracle_script(build_tiny_tokenizer()))


@pytest.fixture
def no_leftovers():
    """Fail if a test leaves any new descendant of this process running."""
    import psutil

    from tests.agent_support.helpers import alive

    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    yield
    after = [c for c in me.children(recursive=True) if c.pid not in before and alive(c.pid)]
    assert not after, f"processes left running: {[(p.pid, p.cmdline()) for p in after]}"
