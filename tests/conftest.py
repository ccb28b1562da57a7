"""Fixtures the test modules share, and the tiers. A module that uses `client` defines its own
`cluster` (a LocalCluster, module-scoped); `client` connects to it once every worker has joined.

Tiers, by folder, each also a marker (`pytest -m unit`, `-m "not e2e"`):
- unit/: the sans-IO scheduler core, block manager, codec, sampler: no process, no model; the
  quick tier (`python -m pytest tests/unit`, well under a minute on 2 cores).
- models/: model code in this process against transformers (runner, layers, kernels).
- fuzz/: hypothesis and coverage-guided fuzzing of the core and the decoders.
- e2e/: real scheduler, worker and gateway processes on loopback, real ZeroMQ and HTTP.
"""
import pathlib

import pytest
from hypothesis import HealthCheck, settings

from client_sdk import AsyncClient
from tests.e2e_helpers import RAY_MISSING
from tests.hf_model_folders import make_llama_folder, write_chat_template

TIERS = ("unit", "models", "fuzz", "e2e")
# How fast examples are drawn is the host's load, not a property of the code under test: on 2
# loaded cores hypothesis's too_slow health check can fail a test that is otherwise fine.
settings.register_profile("stepserve", suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("stepserve")


def pytest_collection_modifyitems(items):
    for item in items:
        tier = pathlib.Path(str(item.path)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> str:
    """A small random-weight Llama saved by transformers, one per module."""
    return make_llama_folder(str(tmp_path_factory.mktemp("models") / "llama"))


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory) -> str:
    """The same with a chat template (tests/hf_model_folders.py writes one)."""
    return write_chat_template(make_llama_folder(str(tmp_path_factory.mktemp("chat") / "llama")))


@pytest.fixture
async def client(cluster):
    async with AsyncClient(cluster.address, timeout_s=60) as c:
        await c.wait_for_workers(cluster.num_worker_processes)
        yield c


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray of 2 CPUs for one module; shut down after it (nothing of Ray idles through the
    rest of the suite)."""
    ray = pytest.importorskip("ray", reason=RAY_MISSING)
    # address="local": always a fresh instance of our own, never a cluster another process left
    # running on this machine (ray.init() would join it, and then refuse num_cpus)
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster():
    """Two Ray nodes simulated on this machine (Ray's own test utility), 2 CPUs each, for one
    module; every Ray process ends after it."""
    ray = pytest.importorskip("ray", reason=RAY_MISSING)
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2)
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
