"""Chaos, bounded (well under a minute): 5,000 requests while workers are killed with SIGKILL at
random moments of the run and replaced, clients vanish without a word, requests are aborted and
streams dropped. Every request ends exactly once (the scheduler counts each once, a wire client
sees one final output per id), every completed one equals a clean run, and afterwards nothing is
held: no waiting or running request, every block free on the scheduler and on the workers, no
failed integrity check in the scheduler's log."""
import asyncio
import random
import time

from client_sdk import AsyncClient, SamplingParams
from protocol.client_messages import Abort, Generate, GenerateRequest
from protocol.codec import encode
from stepserve.launcher import LocalCluster
from stepserve.process_output import tail
from tests.e2e_helpers import ONE_THREAD_WORKER_ARGS, wait_until_workers_hold_nothing
from tests.raw_client import RawClient

PARAMS = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)
NUM_BATCH, NUM_WIRE, NUM_STREAMS, NUM_VANISHING = 3000, 1000, 200, 800  # 5,000 in all
NUM_KILLS = 3


async def kill_workers(cluster: LocalCluster, client: AsyncClient, finished_before: int,
                       rng: random.Random) -> list[float]:
    """SIGKILL a random live worker process (joined or still starting) each time the run has
    finished a random share of its requests (so every kill lands while requests run, however
    fast the machine), starting a replacement each time; NUM_KILLS times. Returns when each was."""
    times = []
    for share in sorted(rng.uniform(0.05, 0.7) for _ in range(NUM_KILLS)):
        while (await client.health()).num_finished - finished_before < share * 5000:
            await asyncio.sleep(0.01)
        victim = rng.choice([p for p in cluster.worker_procs if p.poll() is None])
        victim.kill()
        times.append(time.monotonic())
        victim.wait()
        cluster.add_worker()
    return times


async def wire_client(address: str, prompts: dict[str, list[int]], rng: random.Random) -> dict[str, list]:
    """A bare protocol client: submits, aborts a fifth at random moments, returns every output per id."""
    raw = RawClient(address)
    try:
        await raw.send(encode(Generate([GenerateRequest(rid, p, PARAMS) for rid, p in prompts.items()])))
        to_abort = rng.sample(sorted(prompts), len(prompts) // 5)
        for start in range(0, len(to_abort), 20):
            await raw.receive_until(lambda r, start=start: len(r.outputs) >= start // 4)
            await raw.send(encode(Abort(to_abort[start:start + 20])))

        def all_final(r) -> bool:
            return len(r.outputs) == len(prompts) and all(o[-1].finish_reason for o in r.outputs.values())
        await raw.receive_until(all_final, timeout_s=60)
        return raw.outputs
    finally:
        raw.close()


async def vanishing_client(address: str, prompts: dict[str, list[int]]) -> None:
    """Submits, waits for one output (so the scheduler holds them all), then disappears."""
    raw = RawClient(address)
    await raw.send(encode(Generate([GenerateRequest(rid, p, PARAMS) for rid, p in prompts.items()])))
    await raw.receive_until(lambda r: len(r.outputs) >= 1)
    raw.close()


async def streams(client: AsyncClient, prompts: list[list[int]], rng: random.Random) -> list:
    """Streams; a third are dropped by their reader after a delta (the SDK aborts them)."""
    async def one(prompt, drop: bool):
        tokens = []
        async for delta in client.stream(prompt, PARAMS):
            tokens += delta.token_ids
            if drop:
                return None
        return tokens
    return await asyncio.gather(*[one(p, rng.random() < 1 / 3) for p in prompts])


async def test_chaos_every_request_ends_once_and_nothing_leaks():
    rng = random.Random(13)
    prompts = [[rng.randrange(4, 1000) for _ in range(rng.randrange(3, 12))] for _ in range(5000)]
    batch, wire, streamed, vanishing = (prompts[:NUM_BATCH], prompts[NUM_BATCH:NUM_BATCH + NUM_WIRE],
                                        prompts[NUM_BATCH + NUM_WIRE:NUM_BATCH + NUM_WIRE + NUM_STREAMS],
                                        prompts[NUM_BATCH + NUM_WIRE + NUM_STREAMS:])
    assert len(vanishing) == NUM_VANISHING
    with LocalCluster("micro-llama", 2, worker_args=ONE_THREAD_WORKER_ARGS, scheduler_args=["--max-num-seqs", "64"]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=30) as client, \
                AsyncClient(cluster.address, timeout_s=30) as stream_client:
            await client.wait_for_workers(2)
            clean = [o.outputs[0].token_ids for o in await client.generate_batch(prompts, PARAMS)]
            finished_before = (await client.health()).num_finished

            killer = asyncio.ensure_future(kill_workers(cluster, client, finished_before, rng))
            wire_ids = {f"wire-{i}": p for i, p in enumerate(wire)}
            results = await asyncio.wait_for(asyncio.gather(
                client.generate_batch(batch, PARAMS, window=1000),
                wire_client(cluster.address, wire_ids, rng),
                streams(stream_client, streamed, rng),
                *[vanishing_client(cluster.address, {f"gone-{k}-{i}": p for i, p in enumerate(vanishing[k::4])})
                  for k in range(4)]), timeout=50)
            done_at = time.monotonic()
            kill_times = await killer
            assert all(t < done_at for t in kill_times), "every kill must land while requests run"
            batch_out, wire_out, stream_out = results[:3]

            assert [o.outputs[0].token_ids for o in batch_out] == clean[:NUM_BATCH]
            num_aborted = 0
            for i, rid in enumerate(wire_ids):
                received = wire_out[rid]
                assert [o.finish_reason is not None for o in received] == [True], f"{rid}: {received}"
                if received[0].finish_reason == "abort":
                    num_aborted += 1
                else:
                    assert received[0].new_token_ids == clean[NUM_BATCH + i]
            for i, tokens in enumerate(stream_out):
                assert tokens is None or tokens == clean[NUM_BATCH + NUM_WIRE + i]

            await client.wait_for_workers(2)  # the last replacements, so their reports count too
            health = await wait_until_workers_hold_nothing(client)
            assert health.num_finished - finished_before == 5000, "a request ended twice, or never"
            assert (health.num_waiting, health.num_running, health.num_swapped) == (0, 0, 0)
            assert health.num_free_blocks == health.num_total_blocks
            assert health.worker_kv_blocks_in_use == 0 and health.worker_state_slots_in_use == 0
            log = tail(cluster.scheduler.stderr_file, 1 << 20)
            assert "Traceback" not in log and "step loop failed" not in log, log[-3000:]
            print(f"chaos: {len(kill_times)} workers killed (the last {done_at - kill_times[-1]:.1f} s before the end), {num_aborted} wire aborts, "
                  f"{sum(t is None for t in stream_out)} streams dropped, {NUM_VANISHING} requests of vanished "
                  f"clients; {health.num_finished - finished_before} requests ended once each")
