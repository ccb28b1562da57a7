"""End to end, tensor parallel: a group of two real worker processes (gloo over loopback)
serves as one replica and generates exactly what one worker and transformers generate: a dense
model (Llama, OPT) and a mixture of experts (Mixtral, each expert's features split)."""
import asyncio
import contextlib
import random
import socket

import pytest

from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import TEST_WORKER_ARGS, hf_greedy, wait_until_idle
from tests.hf_model_folders import make_llama_folder, make_mixtral_folder, make_opt_folder, make_qwen3_folder

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8)
LENGTHS = (1, 3, 17, 40)  # decodes next to prefills, the 40-token ones chunked (budget below)
SCHEDULER_ARGS = ["--max-num-seqs", "16", "--max-num-batched-tokens", "64"]


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 1000) for _ in range(rng.choice(LENGTHS))] for _ in range(n)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(stack: contextlib.ExitStack, folder: str, tensor_parallel_size: int,
           worker_args: list[str] = TEST_WORKER_ARGS) -> LocalCluster:
    """A scheduler with one replica: one worker alone, or a group of tensor_parallel_size."""
    cluster = stack.enter_context(LocalCluster(folder, int(tensor_parallel_size == 1),
                                               worker_args=worker_args,
                                               scheduler_args=SCHEDULER_ARGS))
    if tensor_parallel_size > 1:
        address = f"tcp://127.0.0.1:{_free_port()}"
        for rank in range(tensor_parallel_size):
            cluster.add_worker(["--tensor-parallel-size", str(tensor_parallel_size),
                                "--rank", str(rank), "--dist-init-address", address])
    return cluster


async def _generate(cluster: LocalCluster, num_workers: int, prompts, params=GREEDY):
    async with AsyncClient(cluster.address, timeout_s=120) as client:
        await client.wait_for_workers(num_workers)
        outputs = await client.generate_batch(prompts, params)
        health = await wait_until_idle(client)
    return [o.outputs[0].token_ids for o in outputs], health


@pytest.fixture(scope="module")
def gqa_llama_folder(tmp_path_factory):
    # 4 query heads over 2 KV heads: each rank holds 2 query heads and 1 KV head.
    return make_llama_folder(str(tmp_path_factory.mktemp("tp") / "llama"), num_key_value_heads=2)


def test_llama_group_of_two_matches_one_worker_and_transformers(gqa_llama_folder):
    prompts = _prompts(24, seed=3)
    with contextlib.ExitStack() as stack:  # both clusters start at once: start-up overlaps
        group, alone = _start(stack, gqa_llama_folder, 2), _start(stack, gqa_llama_folder, 1)
        (by_group, group_health), (by_one, one_health) = asyncio.run(_gather(
            _generate(group, 2, prompts), _generate(alone, 1, prompts)))
    assert by_group == by_one == hf_greedy(gqa_llama_folder, prompts, GREEDY.max_tokens)
    # Same --kv-cache-gb per rank, half the KV heads each: twice the blocks, all returned.
    assert group_health.num_total_blocks // 2 == one_health.num_total_blocks  # floors of bytes
    assert group_health.num_free_blocks == group_health.num_total_blocks
    assert group_health.num_workers == 2


def test_opt_group_of_two_matches_transformers(tmp_path):
    folder = make_opt_folder(str(tmp_path / "opt"))
    prompts = _prompts(12, seed=4)
    with contextlib.ExitStack() as stack:
        by_group, _ = asyncio.run(_generate(_start(stack, folder, 2), 2, prompts))
    assert by_group == hf_greedy(folder, prompts, GREEDY.max_tokens)


@pytest.mark.parametrize("make_folder", [make_mixtral_folder, make_qwen3_folder], ids=["mixtral", "qwen3"])
def test_group_of_two_matches_one_worker_and_transformers(tmp_path, make_folder):
    """Mixtral: each rank holds half of every expert's intermediate features (the compiled MoE
    step is tests/models/test_moe_models.py's). Qwen3: each rank 2 query heads over 1 KV head,
    the q/k norms whole (one weight per head_dim)."""
    folder = make_folder(str(tmp_path / "model"))
    prompts = _prompts(12, seed=5)
    with contextlib.ExitStack() as stack:
        group, alone = _start(stack, folder, 2), _start(stack, folder, 1)
        (by_group, _), (by_one, _) = asyncio.run(_gather(_generate(group, 2, prompts), _generate(alone, 1, prompts)))
    assert by_group == by_one == hf_greedy(folder, prompts, GREEDY.max_tokens)


async def _gather(*coroutines):
    return await asyncio.gather(*coroutines)
