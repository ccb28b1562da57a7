"""Fixtures the test modules share. A module that uses `client` defines its own `cluster` (a
LocalCluster, module-scoped); `client` connects to it once every worker has joined."""
import pytest

from client_sdk import AsyncClient
from tests.hf_model_folders import make_llama_folder, write_chat_template


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
