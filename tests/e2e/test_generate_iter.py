"""Streaming batches in the SDK: generate_iter reads any iterable lazily, keeps a bounded window in
flight and yields each prompt as it finishes; generate_batch is the same machinery, in order."""
import asyncio
import random

import pytest

from client_sdk import Client, SamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import TEST_WORKER_ARGS, wait_until_idle

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster("micro-llama", 1, worker_args=TEST_WORKER_ARGS,
                      scheduler_args=["--max-num-seqs", "16"]) as running:
        yield running


def prompts_of(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 1000) for _ in range(rng.choice((3, 9, 17)))] for _ in range(n)]


async def test_generate_iter_reads_lazily_within_the_window_and_equals_generate_batch(client):
    prompts = prompts_of(40)
    reference = [o.outputs[0].token_ids for o in await client.generate_batch(prompts, GREEDY)]
    num_read = 0
    max_ahead = 0  # prompts read but not yet yielded: never more than the window
    num_yielded = 0

    def source():
        nonlocal num_read, max_ahead
        for p in prompts:
            num_read += 1
            max_ahead = max(max_ahead, num_read - num_yielded)
            yield p

    got: dict[int, list[int]] = {}
    async for index, output in client.generate_iter(source(), GREEDY, window=10):
        num_yielded += 1
        assert index not in got
        got[index] = output.outputs[0].token_ids
        assert output.prompt_token_ids == prompts[index]
    assert max_ahead <= 10
    assert [got[i] for i in range(len(prompts))] == reference
    assert (await wait_until_idle(client)).num_waiting == 0


async def test_generate_iter_takes_async_iterables_per_prompt_params_and_text(client):
    lengths = [2, 5, 3, 7]

    async def source():
        for p in ["hello", [5, 6, 7], "the quick brown fox", [9, 9]]:
            await asyncio.sleep(0)
            yield p

    params = (SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n) for n in lengths)
    got = {i: o async for i, o in client.generate_iter(source(), params, window=2, priority=[0, 1, 2, 3])}
    assert sorted(got) == [0, 1, 2, 3]
    assert [len(got[i].outputs[0].token_ids) for i in range(4)] == lengths
    assert got[0].prompt == "hello" and isinstance(got[0].outputs[0].text, str)


async def test_closing_generate_iter_early_aborts_what_is_in_flight(client):
    long = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=60)
    stream = client.generate_iter(iter(prompts_of(300, seed=2)), long, window=8)
    async for _ in stream:
        break
    await stream.aclose()
    health = await wait_until_idle(client)
    assert health.num_running == 0 and health.num_waiting == 0


def test_blocking_client_generate_iter_matches(cluster):
    prompts = prompts_of(30, seed=4)
    with Client(cluster.address) as client:
        reference = [o.outputs[0].token_ids for o in client.generate_batch(prompts, GREEDY)]
        got = dict((i, o.outputs[0].token_ids) for i, o in client.generate_iter(iter(prompts), GREEDY, window=4))
    assert [got[i] for i in range(len(prompts))] == reference


def test_llm_generate_takes_any_iterable_and_generate_iter_yields_as_finished():
    from stepserve import LLM
    prompts = prompts_of(12, seed=5)
    with LLM(model="micro-llama", dtype="float32", kv_cache_gb=0.05, enforce_eager=True) as llm:
        reference = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        from_generator = llm.generate((p for p in prompts), GREEDY, use_tqdm=False, priority=[1] * 12)
        streamed = dict(llm.generate_iter(iter(prompts), GREEDY, window=3))
    assert [o.outputs[0].token_ids for o in from_generator] == reference
    assert [streamed[i].outputs[0].token_ids for i in range(12)] == reference
