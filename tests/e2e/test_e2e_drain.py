"""Graceful drain, with real processes on loopback: SIGTERM to the scheduler in the middle of a
batch. Every request either completes with the right tokens or fails with `shutting_down`, none
is lost, requests keep completing during the drain, the batch returns every output, new
requests are refused, the worker finishes its step and exits when told to, and the scheduler
exits 0."""
import asyncio
import re
import signal

from client_sdk import AsyncClient, SamplingParams
from protocol import ErrorCode
from stepserve.launcher import LocalCluster
from stepserve.process_output import tail
from tests.e2e_helpers import ONE_THREAD_WORKER_ARGS, random_prompts

SHORT = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8)
# Last in the batch: at the SIGTERM they still wait behind ~500 short ones (~250 steps of 16), and
# those steps and their own 480 cannot fit in the drain on any CPU (a step is a ZeroMQ round trip
# and a forward: 730 of them in 0.3 s is 0.4 ms each; 3.3 ms on 2 quiet EPYC vCPUs), so the drain
# always cuts some.
LONG = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=480)
NUM_SHORT, NUM_LONG = 600, 8
# Long enough for a few steps on a loaded 2-core host (a step there has taken 50+ ms), so that
# requests finish during the drain however slow the machine; the bound's value is not what is tested.
DRAIN_TIMEOUT_S = 0.3


async def test_sigterm_mid_batch_finishes_or_fails_every_request_and_exits_0():
    with LocalCluster("micro-llama", 1, worker_args=ONE_THREAD_WORKER_ARGS,
                      scheduler_args=["--max-num-seqs", "16", "--drain-timeout-s", str(DRAIN_TIMEOUT_S)]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=30) as client:
            await client.wait_for_workers(1)
            prompts = random_prompts(NUM_SHORT + NUM_LONG, 1000, lengths=(5,), seed=2)
            params = [SHORT] * NUM_SHORT + [LONG] * NUM_LONG
            # The long ones are cut below, so only the short ones need a reference.
            reference = [o.outputs[0].token_ids for o in await client.generate_batch(prompts[:NUM_SHORT], SHORT)]

            batch = asyncio.ensure_future(client.generate_batch(prompts, params))
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
            failed = [i for i, o in enumerate(outputs) if not o.ok]
            assert set(range(NUM_SHORT, NUM_SHORT + NUM_LONG)) <= set(failed), "the drain timeout cut nothing"
            assert all(outputs[i].error_code == ErrorCode.SHUTTING_DOWN for i in failed)
            assert all(outputs[i].outputs[0].token_ids == reference[i] for i in completed)
            assert cluster.scheduler.wait(timeout=15) == 0
            # "During the drain" as the scheduler saw it, from its drain's start to its cut: a
            # client's poll of health would see the drain late on a loaded host.
            log = tail(cluster.scheduler.stderr_file, 1 << 20)
            num_at_start = int(re.search(r"draining: (\d+) requests to finish", log)[1])
            num_left = int(re.search(r"drain: (\d+) requests not finished", log)[1])
            assert num_at_start > num_left, "nothing completed during the drain"
            assert len(failed) >= num_left >= NUM_LONG
            print(f"drain: {len(completed)} completed ({num_at_start - num_left} during the drain), "
                  f"{len(failed)} failed with shutting_down ({num_left} cut by the drain timeout)")
            assert cluster.worker_procs[0].wait(timeout=15) == 0
