"""Data-parallel replicas and a worker killed mid-batch, with real processes on loopback."""
import asyncio
import os
import signal

import pytest

from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import ONE_THREAD_WORKER_ARGS, random_prompts, wait_until_idle

PARAMS = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8)
LONG = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=400)


@pytest.fixture(scope="module")
def cluster():
    # Small batches so 2,000 requests take many steps and the kill lands mid-batch.
    with LocalCluster("micro-llama", 2, worker_args=ONE_THREAD_WORKER_ARGS,
                      scheduler_args=["--worker-timeout", "2", "--max-num-seqs", "32"]) as running:
        yield running


async def collect_stream(client: AsyncClient, prompt: list[int]) -> list[list[int]]:
    return [d.token_ids async for d in client.stream(prompt, LONG)]


async def test_two_replicas_share_the_work_then_survive_a_killed_worker(cluster, client):
    prompts = random_prompts(2000, 1000, seed=7)
    stream_prompts = random_prompts(6, 1000, lengths=(5,), seed=8)

    before = {r.name: r.num_steps for r in (await client.health()).replicas}
    reference = await client.generate_batch(prompts, PARAMS)
    stream_reference = [o.outputs[0].token_ids for o in await client.generate_batch(stream_prompts, LONG)]
    after = {r.name: r.num_steps for r in (await client.health()).replicas}
    assert len(after) == 2 and all(after[name] > before.get(name, 0) for name in after), "both replicas work"
    assert all(len(o.outputs[0].token_ids) == PARAMS.max_tokens for o in reference)

    # Same work again; kill -9 one worker once a few hundred requests have finished.
    streams = [asyncio.ensure_future(collect_stream(client, p)) for p in stream_prompts]
    batch = asyncio.ensure_future(client.generate_batch(prompts, PARAMS))
    finished_at_start = (await client.health()).num_finished
    while (await client.health()).num_finished < finished_at_start + 300:
        await asyncio.sleep(0.02)
    assert not any(s.done() for s in streams), "the kill must land while the streams run"
    victim = cluster.worker_procs[0]
    os.kill(victim.pid, signal.SIGKILL)
    outputs = await asyncio.wait_for(batch, 300)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in reference]
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    for stream, expected in zip(streams, stream_reference):
        deltas = await asyncio.wait_for(stream, 300)
        assert sum(deltas, []) == expected, "a stream repeated or skipped a token"
    health = await wait_until_idle(client)
    assert health.num_workers == 1 and health.num_free_blocks == health.num_total_blocks

    # A worker that comes back is used again.
    cluster.add_worker()
    await client.wait_for_workers(2)
    steps = {r.name: r.num_steps for r in (await client.health()).replicas}
    again = await client.generate_batch(prompts[:400], PARAMS)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in reference[:400]]
    grown = {r.name: r.num_steps for r in (await client.health()).replicas}
    assert all(grown[name] > steps[name] for name in grown), "the new worker takes work"
