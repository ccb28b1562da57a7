"""Workers that stall without dying (SIGSTOP: a debugger, swap, a wedged step), with real
processes on loopback: /health tells the truth and a resumed worker rejoins by itself; and a
client closed with aborts still to send leaves no error behind."""
import asyncio
import gc
import json
import logging
import os
import signal
import time

import pytest

from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import ONE_THREAD_WORKER_ARGS, random_prompts, wait_until_idle
from tests.gateway_helpers import curl, metric_samples, post_json

WORKER_TIMEOUT_S = 2.0
# docs/operations.md's bounds at --worker-timeout 2: dropped within the timeout and a watchdog
# tick (0.5 s), back within 3 s of SIGCONT; plus slack for 2 loaded cores.
DROPPED_WITHIN_S = WORKER_TIMEOUT_S + 0.5 + 5
REJOINED_WITHIN_S = 3 + 5
LONG = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=64)
PROMPTS = random_prompts(20, 1000, lengths=(6,), seed=11)


@pytest.fixture(scope="module")
def cluster():
    # Four sequences a replica: 20 streams fill both replicas' cores, so each holds some.
    with LocalCluster("micro-llama", 2, worker_args=ONE_THREAD_WORKER_ARGS,
                      scheduler_args=["--worker-timeout", str(WORKER_TIMEOUT_S), "--max-num-seqs", "4"]) as running:
        running.start_gateway()
        yield running


async def health(url: str) -> tuple[int, dict]:
    status, body = await asyncio.to_thread(curl, url + "/health", timeout_s=10)
    return status, json.loads(body)


async def health_until(url: str, done, within_s: float) -> tuple[int, dict]:
    """Polls the gateway's /health until done(status, body); fails past within_s."""
    deadline = time.monotonic() + within_s
    while True:
        status, body = await health(url)
        if done(status, body):
            return status, body
        assert time.monotonic() < deadline, f"/health still {status} {body} after {within_s} s"
        await asyncio.sleep(0.1)


async def replicas_gauges(url: str) -> tuple[float, float]:
    _, text = await asyncio.to_thread(curl, url + "/metrics")
    samples = metric_samples(text)
    return samples[("stepserve:num_replicas_healthy", ())], samples[("stepserve:num_replicas_unhealthy", ())]


async def stream_tokens(client: AsyncClient, prompt: list[int]) -> list[int]:
    return [t async for delta in client.stream(prompt, LONG) for t in delta.token_ids]


async def other_tasks_done(timeout_s: float = 10.0) -> None:
    """Until every task but the caller's has ended; holds no reference to them after."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=timeout_s)


async def test_stalled_workers_are_dropped_then_rejoin_when_they_resume(cluster, client):
    url = cluster.base_url
    reference = [o.outputs[0].token_ids for o in await client.generate_batch(PROMPTS, LONG)]
    first, second = cluster.worker_procs
    pids = [first.pid, second.pid]

    # One worker stops mid-way through 20 streams: every stream ends, whole, on the other.
    streams = [asyncio.ensure_future(stream_tokens(client, p)) for p in PROMPTS]
    async with asyncio.timeout(60):
        while not (len(h := (await client.health()).replicas) == 2 and all(r.num_running for r in h)):
            await asyncio.sleep(0.02)
    os.kill(first.pid, signal.SIGSTOP)
    status, body = await health_until(url, lambda s, b: b["unhealthy_replicas"], DROPPED_WITHIN_S)
    assert status == 200 and body["num_workers"] == 1 and len(body["unhealthy_replicas"]) == 1
    assert await replicas_gauges(url) == (1, 1)
    assert await asyncio.wait_for(asyncio.gather(*streams), 120) == reference

    # Both stopped: /health fails, a new HTTP request is refused at once, an SDK request waits.
    os.kill(second.pid, signal.SIGSTOP)
    status, body = await health_until(url, lambda s, b: s == 503, DROPPED_WITHIN_S)
    assert body["status"] == "no_worker" and len(body["unhealthy_replicas"]) == 2
    assert await replicas_gauges(url) == (0, 2)
    status, refused = await asyncio.to_thread(post_json, url + "/v1/completions",
                                              {"model": "micro-llama", "prompt": PROMPTS[0], "max_tokens": 4})
    assert status == 503 and "no worker" in json.loads(refused)["error"]["message"]
    waiting = asyncio.ensure_future(client.generate(PROMPTS[0], LONG))

    # Resumed: each forgets what the scheduler moved, says hello again and serves as before.
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    status, body = await health_until(url, lambda s, b: b["num_workers"] == 2, REJOINED_WITHIN_S)
    assert status == 200 and body["unhealthy_replicas"] == []
    assert await replicas_gauges(url) == (2, 0)
    assert (await asyncio.wait_for(waiting, 60)).outputs[0].token_ids == reference[0]
    again = await client.generate_batch(PROMPTS, LONG)
    assert [o.outputs[0].token_ids for o in again] == reference
    assert [p.pid for p in cluster.worker_procs] == pids and all(p.poll() is None for p in cluster.worker_procs)
    idle = await wait_until_idle(client)
    assert idle.num_free_blocks == idle.num_total_blocks
    async with asyncio.timeout(10):  # the workers' heartbeats: no KV kept for moved requests
        while (await client.health()).worker_kv_blocks_in_use:
            await asyncio.sleep(0.1)


async def test_a_client_closed_with_aborts_to_send_leaves_no_error(cluster, client, caplog):
    """Streams left after their client closed abort in their finally blocks: nothing is sent on
    the closed socket, nothing is left in a task nobody awaits, and the scheduler ends them itself."""
    loop = asyncio.get_running_loop()
    unhandled = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    caplog.set_level(logging.WARNING, logger="stepserve.client")
    try:
        closing = AsyncClient(cluster.address, timeout_s=30)
        streams = [closing.stream(p, LONG) for p in PROMPTS[:4]]
        for stream in streams:
            await anext(stream)  # live on the scheduler
        await closing.close()
        for stream in streams:
            await stream.aclose()  # its finally asks for an abort
        await other_tasks_done()
        gc.collect()  # an unretrieved task exception is reported when its task is collected
        assert unhandled == [] and caplog.records == []
    finally:
        loop.set_exception_handler(None)
    health = await wait_until_idle(client)
    assert health.num_running == 0 and health.num_free_blocks == health.num_total_blocks
