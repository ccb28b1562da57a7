"""Mamba and Jamba served end to end under pressure: random aborts, a tiny KV pool that forces
preemption, few state slots. Nothing may leak and no output may differ from the request alone."""
import asyncio
import random
import time

import pytest

from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import wait_until_idle


@pytest.mark.parametrize("model", ["tiny-jamba", "tiny-mamba"])
async def test_random_aborts_and_preemption_leak_nothing(model):
    rng = random.Random(11)
    worker_args = ["--dtype", "float32", "--num-gpu-blocks", "8", "--num-state-slots", "4", "--threads", "1"]
    prompts = [[rng.randrange(4, 1000) for _ in range(rng.randrange(3, 30))] for _ in range(24)]
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=rng.randrange(4, 40)) for _ in prompts]
    abort_after = [rng.choice([None, None, 0, 1, 3, 8]) for _ in prompts]  # deltas seen before the abort

    with LocalCluster(model, 1, worker_args=worker_args, scheduler_args=["--max-num-seqs", "6"]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=60) as client:
            await client.wait_for_workers(1)

            async def run(i: int) -> tuple[list[int], str]:
                tokens, reason = [], None
                async for delta in client.stream(prompts[i], params[i], request_id=f"r{i}"):
                    tokens += delta.token_ids
                    reason = delta.finish_reason
                    if abort_after[i] is not None and len(tokens) >= abort_after[i] and reason is None:
                        await client.abort(f"r{i}")
                return tokens, reason

            async def abort_early(i: int) -> None:  # aborts while the request is still waiting
                await asyncio.sleep(rng.random() * 0.05)
                await client.abort(f"r{i}")

            tasks = [asyncio.ensure_future(run(i)) for i in range(len(prompts))]
            early = [asyncio.ensure_future(abort_early(i)) for i in range(len(prompts)) if abort_after[i] == 0]
            results = await asyncio.wait_for(asyncio.gather(*tasks), 300)
            await asyncio.gather(*early)

            alone = [(await client.generate(prompts[i], params[i])).outputs[0] for i in range(len(prompts))]
            for i, (tokens, reason) in enumerate(results):
                if reason == "length":
                    assert tokens == alone[i].token_ids, f"request {i} differs from its run alone"
                else:
                    assert reason == "abort" and abort_after[i] is not None
                    assert tokens == alone[i].token_ids[:len(tokens)], f"aborted request {i} diverged"
            assert any(r == "abort" for _, r in results) and any(r == "length" for _, r in results)

            health = await wait_until_idle(client)
            assert health.num_preemptions > 0, "the tiny KV pool must force preemption"
            assert health.num_free_blocks == health.num_total_blocks
            assert health.num_free_state_slots == health.num_total_state_slots
            assert health.num_prefix_cache_queries == 0 and health.num_cached_blocks == 0  # off for state
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the worker's own view arrives with its heartbeat
                health = await client.health()
                if health.worker_kv_blocks_in_use == 0 and health.worker_state_slots_in_use == 0:
                    break
                await asyncio.sleep(0.1)
            assert health.worker_kv_blocks_in_use == 0 and health.worker_state_slots_in_use == 0
