"""A worker whose step hangs while its heartbeats go on (a kernel wedged with the GIL released:
vLLM's server answers /health 200 then): the scheduler drops it after --step-timeout, its
requests finish on the other replica, and it rejoins by itself once the step ends."""
import asyncio
import subprocess
import sys
import time

from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import ONE_THREAD_WORKER_ARGS, random_prompts
from tests.hanging_worker import HANG_MARKER

STEP_TIMEOUT_S = 2.0
HANG_S = 15.0
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8)
PROMPTS = [HANG_MARKER + p for p in random_prompts(24, 990, lengths=(5,), seed=3)]


async def test_a_worker_hung_in_a_step_is_dropped_its_requests_moved_and_it_rejoins():
    with LocalCluster("micro-llama", 1, worker_args=ONE_THREAD_WORKER_ARGS,
                      scheduler_args=["--step-timeout", str(STEP_TIMEOUT_S), "--max-num-seqs", "2"]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=60) as client:
            reference = [o.outputs[0].token_ids for o in await client.generate_batch(PROMPTS, GREEDY)]
            hanging = subprocess.Popen(
                [sys.executable, "-m", "tests.hanging_worker", "--hang-s", str(HANG_S), "--scheduler",
                 cluster.worker_address, "--model", "micro-llama", *ONE_THREAD_WORKER_ARGS],
                stderr=subprocess.PIPE, text=True)
            try:
                await client.wait_for_workers(2, timeout_s=120)
                started = time.monotonic()
                batch = asyncio.ensure_future(client.generate_batch(PROMPTS, GREEDY))
                async with asyncio.timeout(60):  # two sequences a replica: both take some
                    while not (len(h := (await client.health()).replicas) == 2 and all(r.num_running for r in h)):
                        await asyncio.sleep(0.02)
                outputs = await batch
                took = time.monotonic() - started
                assert [o.outputs[0].token_ids for o in outputs] == reference
                assert took < HANG_S - 4, f"{took:.1f} s: the hung step's requests waited for it"
                health = await client.health()
                assert health.num_workers == 1 and len(health.unhealthy_replicas) == 1

                async with asyncio.timeout(HANG_S + 30):  # the step ends, the worker says hello again
                    while (await client.health()).num_workers < 2:
                        await asyncio.sleep(0.2)
                assert (await client.health()).unhealthy_replicas == []
                again = await client.generate_batch(PROMPTS, GREEDY)
                assert [o.outputs[0].token_ids for o in again] == reference
                assert hanging.poll() is None
            finally:
                hanging.terminate()
                stderr = hanging.communicate(timeout=60)[1]
    assert "hanging in step" in stderr, stderr[-2000:]
