"""Batch work yields to interactive work: under --scheduling-policy priority (vLLM's convention,
lower first), an interactive request arriving while batch requests fill every seat preempts
one of them and finishes first; the batch still completes, equal to a run alone."""
import asyncio

from client_sdk import AsyncClient, SamplingParams
from client_sdk.launcher import LocalCluster
from protocol.client_messages import BATCH_PRIORITY
from tests.e2e_helpers import TEST_WORKER_ARGS, wait_until_idle

LONG = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=16)
SHORT = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=4)


async def test_an_interactive_request_preempts_a_running_batch_request():
    with LocalCluster("micro-llama", 1, worker_args=TEST_WORKER_ARGS,
                      scheduler_args=["--max-num-seqs", "2", "--scheduling-policy", "priority"]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=60) as client:
            await client.wait_for_workers(1)
            prompts = [[5 + i, 6, 7] for i in range(4)]
            alone = [o.outputs[0].token_ids for o in await client.generate_batch(prompts, LONG)]
            batch = asyncio.ensure_future(client.generate_batch(prompts, LONG, priority=BATCH_PRIORITY))
            while (await client.health()).num_running < 2:
                await asyncio.sleep(0.01)
            before = (await client.health()).num_preemptions
            interactive = await client.generate([9, 9, 9], SHORT, priority=0)
            assert not batch.done()  # it got a seat while every seat was the batch's
            health = await client.health()
            assert health.num_preemptions > before
            assert [o.outputs[0].token_ids for o in await batch] == alone  # recomputed exactly
            assert len(interactive.outputs[0].token_ids) == 4
            await wait_until_idle(client)
