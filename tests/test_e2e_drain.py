"""Graceful drain, with real processes on loopback: SIGTERM to the scheduler in the middle of a
batch. Every request either completes with the right tokens or fails with `shutting_down`, none
is lost, the batch returns every output, new requests are refused, the worker finishes its step
and exits when told to, and the scheduler exits 0."""
import asyncio
import signal

from client_sdk import AsyncClient, SamplingParams
from client_sdk.launcher import LocalCluster
from protocol import ErrorCode
from tests.test_e2e_restarts import WORKER_ARGS
from tests.test_e2e_service import random_prompts

SHORT = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8)


async def test_sigterm_mid_batch_finishes_or_fails_every_request_and_exits_0():
    with LocalCluster("micro-llama", 1, worker_args=WORKER_ARGS,
                      scheduler_args=["--max-num-seqs", "16", "--drain-timeout-s", "0.5"]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=30) as client:
            await client.wait_for_workers(1)
            prompts = random_prompts(600, 1000, seed=2)
            reference = [o.outputs[0].token_ids for o in await client.generate_batch(prompts, SHORT)]

            batch = asyncio.ensure_future(client.generate_batch(prompts, SHORT))
            finished_at_start = (await client.health()).num_finished
            while (await client.health()).num_finished < finished_at_start + 100:
                await asyncio.sleep(0.01)
            cluster.scheduler.send_signal(signal.SIGTERM)
            while not (await client.health()).draining:
                await asyncio.sleep(0.01)
            late = await client.generate_batch([[5, 6, 7]], SHORT)
            assert late[0].error_code == ErrorCode.SHUTTING_DOWN

            outputs = await asyncio.wait_for(batch, 30)
            assert len(outputs) == len(prompts)
            completed = [i for i, o in enumerate(outputs) if o.ok]
            failed = [o for o in outputs if not o.ok]
            assert completed and failed, "the drain timeout should cut the batch"
            assert all(o.error_code == ErrorCode.SHUTTING_DOWN for o in failed)
            assert all(outputs[i].outputs[0].token_ids == reference[i] for i in completed)
            print(f"drain: {len(completed)} completed, {len(failed)} failed with shutting_down")
            assert cluster.scheduler.wait(timeout=15) == 0
            assert cluster.worker_procs[0].wait(timeout=15) == 0
