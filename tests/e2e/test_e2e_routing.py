"""Prefix routing end to end: a scheduler and two worker processes on loopback, real ZeroMQ and
torch. Prompts sharing system prompts arrive in waves, one request at a time as chats do, so
either replica may be the one asking for work when a request arrives; with --routing prefix every request after
the first wave finds its whole prefix cached (on the replica that computed it), with --routing
load wherever it happened to land; the greedy outputs equal transformers' either way."""
import asyncio
import random

import pytest

from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import ONE_THREAD_WORKER_ARGS, hf_greedy, wait_until_idle

BLOCK_SIZE = 4
PREFIX_LEN = 24  # six full blocks
PARAMS = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)
WORKER_ARGS = [*ONE_THREAD_WORKER_ARGS, "--dtype", "float32", "--block-size", str(BLOCK_SIZE)]


def waves(seed: int = 3) -> list[list[list[int]]]:
    """One prompt per system prompt, then three waves of six sharing them, each a new question."""
    rng = random.Random(seed)
    systems = [[rng.randrange(4, 1000) for _ in range(PREFIX_LEN)] for _ in range(4)]

    def question() -> list[int]:
        return [rng.randrange(4, 1000) for _ in range(rng.randrange(3, 9))]

    first = [system + question() for system in systems]
    return [first] + [[rng.choice(systems) + question() for _ in range(6)] for _ in range(3)]


@pytest.mark.parametrize("routing", ["prefix", "load"])
async def test_routing_by_prefix_finds_every_cached_prefix_and_keeps_outputs_exact(llama_folder, routing):
    prompt_waves = waves()
    outputs = []
    with LocalCluster(llama_folder, 2, worker_args=WORKER_ARGS, scheduler_args=["--routing", routing]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=120) as client:
            await client.wait_for_workers(2)
            for wave in prompt_waves:
                done = await asyncio.gather(*(client.generate(prompt, PARAMS) for prompt in wave))
                outputs += [o.outputs[0].token_ids for o in done]
                health = await wait_until_idle(client)
    prompts = [p for wave in prompt_waves for p in wave]
    assert outputs == hf_greedy(llama_folder, prompts, PARAMS.max_tokens)
    later = sum(len(wave) for wave in prompt_waves[1:])
    replicas = health.replicas
    assert len(replicas) == 2
    assert sum(r.num_prefix_cache_hits for r in replicas) == health.num_prefix_cache_hits
    routed = sum(r.num_routed_by_prefix for r in replicas)
    if routing == "prefix":
        # The first wave computes each system prompt once; every later request finds all of it.
        assert health.num_prefix_cache_hits == later * PREFIX_LEN
    else:
        assert routed == 0 and health.num_prefix_cache_hits <= later * PREFIX_LEN
