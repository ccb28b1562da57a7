"""Batch work yields to interactive work: under --scheduling-policy priority (vLLM's convention,
lower first), an interactive request arriving while batch requests fill every seat and the
scheduler's queues preempts one of them in the very plan it is admitted in, and finishes within a
few steps, before any batch request does; the batch still completes, equal to a run alone."""
import asyncio

from client_sdk import AsyncClient, SamplingParams
from protocol.client_messages import BATCH_PRIORITY
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import TEST_WORKER_ARGS, wait_until_idle

# Long enough that the running batch requests, a few steps in when the queues fill up, cannot
# finish in the interactive one's ~6 steps, even when this client polls ~40 steps late (a stall
# of a loaded host); at 24, a stall of ~18 steps would let a batch request finish first by right.
LONG = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=48)
SHORT = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=4)


async def test_an_interactive_request_preempts_a_running_batch_request():
    # 2 seats and a core queue of 2 x max_num_seqs: of 8 batch requests 2 run, 4 wait in the
    # core and 2 in the service's queue, so the interactive one must pass both queues.
    with LocalCluster("micro-llama", 1, worker_args=TEST_WORKER_ARGS,
                      scheduler_args=["--max-num-seqs", "2", "--scheduling-policy", "priority"]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=60) as client:
            await client.wait_for_workers(1)
            prompts = [[5 + i, 6, 7] for i in range(8)]
            alone = [o.outputs[0].token_ids for o in await client.generate_batch(prompts, LONG)]
            batch = asyncio.ensure_future(client.generate_batch(prompts, LONG, priority=BATCH_PRIORITY))
            # Until the core's queue is at its watermark (2 x max_num_seqs), the rest in the service's.
            while (before := await client.health()).replicas[0].num_waiting < 4 or before.num_waiting < 6:
                await asyncio.sleep(0.01)
            interactive = await client.generate([9, 9, 9], SHORT, priority=0)
            after = await client.health()
            assert not batch.done()
            assert after.num_finished - before.num_finished == 1  # no batch request finished first
            assert after.num_preemptions > before.num_preemptions
            # Admitted in the plan after the one in flight, with its first token; 3 more steps: 6.
            # The steps while `before`'s reply and the request travel, and while the reply and
            # `after`'s query do, count too: more on a loaded 2-core host (13 seen). Without the
            # preemption it would wait for a batch request to end (tens of steps, and the count
            # of finished requests above would show it).
            assert after.num_steps - before.num_steps <= 18, (before, after)
            assert [o.outputs[0].token_ids for o in await batch] == alone  # recomputed exactly
            assert len(interactive.outputs[0].token_ids) == 4
            await wait_until_idle(client)
