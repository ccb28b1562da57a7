"""Async scheduling end to end: the same greedy requests through a scheduler with two plans in
flight and through one with one give the same tokens, equal to transformers, in the streams as
in the final outputs. Memory is short (growing requests preempt others) and some requests stop
on a token mid-way, so the async scheduler does compute tokens past a request's end: they must
never reach the client."""
import asyncio
import random


from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import hf_greedy, wait_until_idle

MAX_TOKENS = 14
# 40 blocks of 4 tokens for prompts of up to 30 tokens growing by 14: a few at a time fit.
WORKER_ARGS = ["--dtype", "float32", "--block-size", "4", "--num-gpu-blocks", "40", "--threads", "1",
               "--enforce-eager"]


def workload(expected: list[list[int]]) -> list[SamplingParams]:
    """Every third request stops on the token greedy decoding gives it at step 5 (so it ends
    early, on a token, as EOS would); the others run to MAX_TOKENS."""
    return [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=MAX_TOKENS,
                           stop_token_ids=[tokens[5]] if i % 3 == 0 else [])
            for i, tokens in enumerate(expected)]


def truncated_at_stop(tokens: list[int], params: SamplingParams) -> list[int]:
    for i, token in enumerate(tokens):
        if params.stop_token_ids and token in params.stop_token_ids:
            return tokens[:i + 1]
    return tokens


async def run_mode(folder: str, async_scheduling: bool, prompts, params) -> tuple[list, list, int]:
    flag = "--async-scheduling" if async_scheduling else "--no-async-scheduling"
    with LocalCluster(folder, 1, worker_args=WORKER_ARGS, scheduler_args=[flag]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=120) as client:
            await client.wait_for_workers(1)

            async def streamed(prompt, p):
                return [d async for d in client.stream(prompt, p)]

            streams = await asyncio.gather(*(streamed(p, sp) for p, sp in zip(prompts, params)))
            finals = [o.outputs[0] for o in await client.generate_batch(prompts, params)]
            health = await wait_until_idle(client)
            assert health.num_free_blocks == health.num_total_blocks
            (replica,) = health.replicas
            assert replica.mean_step_time_ms > 0 and 0 < replica.worker_busy_fraction <= 1
            return streams, finals, health.num_preemptions


async def test_async_and_sync_scheduling_stream_the_same_tokens_as_transformers(llama_folder):
    rng = random.Random(3)
    prompts = [[rng.randrange(4, 1000) for _ in range(rng.choice((3, 9, 17, 30)))] for _ in range(24)]
    expected = hf_greedy(llama_folder, prompts, MAX_TOKENS)
    params = workload(expected)
    expected = [truncated_at_stop(tokens, p) for tokens, p in zip(expected, params)]
    assert any(len(tokens) < MAX_TOKENS for tokens in expected), "no request stops on a token"
    results = {}
    for async_scheduling in (True, False):
        streams, finals, num_preemptions = await run_mode(llama_folder, async_scheduling, prompts, params)
        assert num_preemptions > 0, "memory was never short"
        for deltas, final, tokens in zip(streams, finals, expected):
            # Nothing after the finishing delta, nothing missing: the deltas are the output.
            assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
            assert deltas[-1].finish_reason == final.finish_reason
            assert sum((d.token_ids for d in deltas), []) == final.token_ids == tokens
            assert final.finish_reason == ("length" if len(tokens) == MAX_TOKENS else "stop")
        results[async_scheduling] = [f.token_ids for f in finals]
    assert results[True] == results[False]
