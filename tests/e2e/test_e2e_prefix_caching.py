"""Prefix caching end to end: real scheduler and worker processes, real ZeroMQ, real torch.

One mixed workload (prefixes shared, partly shared and not shared, block-aligned prompts that
are cached whole) runs on a tight KV pool, so preemption happens, while some requests sharing
the prefixes are aborted mid-stream. Greedy outputs must equal, token for token, the same
workload with caching off and Hugging Face transformers.
"""
import asyncio
import random


from client_sdk import AsyncClient, SamplingParams
from scheduler_svc.block_manager import MIN_SHARED_TOKENS
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import hf_greedy, wait_until_idle
from tests.hf_model_folders import make_llama_folder

BLOCK_SIZE = 4
# 48 blocks of 4 tokens: two or three requests at a time, so growing ones preempt others.
WORKER_ARGS = ["--dtype", "float32", "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks", "48",
               "--threads", "1"]
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12)
DOOMED = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=80)


def mixed_prompts(seed: int = 5) -> list[list[int]]:
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(4, 1000) for _ in range(n)]

    system, document = tokens(40), tokens(23)  # block-aligned, and not
    prompts = []
    for _ in range(12):
        prompts.append(system + tokens(rng.randrange(1, 20)))  # shared prefix
        prompts.append(document + tokens(rng.randrange(1, 20)))  # shared, not block-aligned
        prompts.append(system[:rng.randrange(5, 30)] + tokens(rng.randrange(5, 20)))  # partly shared
        prompts.append(tokens(BLOCK_SIZE) + system[BLOCK_SIZE:])  # equal blocks after another head
        prompts.append(tokens(rng.randrange(3, 50)))  # not shared
    prompts += [system] * 3 + [system + document] * 2  # every token cached: copy-on-write
    rng.shuffle(prompts)
    return prompts


async def run_workload(cluster: LocalCluster, prompts: list[list[int]]):
    async with AsyncClient(cluster.address, timeout_s=120) as client:
        await client.wait_for_workers(1)

        async def doomed(i: int, prompt: list[int]) -> str:
            reason = None
            async for delta in client.stream(prompt, DOOMED, request_id=f"doomed-{i}"):
                reason = delta.finish_reason
                if reason is None and delta.token_ids:
                    await client.abort(f"doomed-{i}")
            return reason

        aborted = [asyncio.ensure_future(doomed(i, prompts[i] + [7] * i)) for i in range(6)]
        outputs = await client.generate_batch(prompts, GREEDY)
        reasons = await asyncio.wait_for(asyncio.gather(*aborted), 120)
        health = await wait_until_idle(client)
        return [o.outputs[0].token_ids for o in outputs], reasons, health


async def test_mixed_prefixes_with_preemption_and_aborts_match_caching_off_and_transformers(llama_folder):
    prompts = mixed_prompts()
    results = {}
    for name, scheduler_args in (("on", ["--enable-prefix-caching"]),
                                 ("off", ["--no-enable-prefix-caching"])):
        with LocalCluster(llama_folder, 1, worker_args=WORKER_ARGS, scheduler_args=scheduler_args) as cluster:
            results[name] = await run_workload(cluster, prompts)
    for name, (_, reasons, health) in results.items():
        assert reasons == ["abort"] * 6, name
        assert health.num_preemptions > 0, f"caching {name}: the tight pool must force preemption"
        assert health.num_free_blocks == health.num_total_blocks and health.num_running == 0
    on, off = results["on"][2], results["off"][2]
    assert on.num_prefix_cache_hits > on.num_prefix_cache_queries // 4 and on.num_cached_blocks > 0
    assert off.num_prefix_cache_queries == off.num_prefix_cache_hits == off.num_cached_blocks == 0
    assert results["on"][0] == results["off"][0]
    assert results["on"][0] == hf_greedy(llama_folder, prompts, GREEDY.max_tokens)


async def test_a_prompt_cached_whole_recomputes_only_its_last_token_and_swap_composes(llama_folder):
    rng = random.Random(9)
    prompt = [rng.randrange(4, 1000) for _ in range(10 * BLOCK_SIZE)]
    others = [prompt[:20] + [rng.randrange(4, 1000) for _ in range(40)] for _ in range(8)]
    worker_args = WORKER_ARGS + ["--swap-space-gb", "0.01", "--enforce-eager"]
    with LocalCluster(llama_folder, 1, worker_args=worker_args, scheduler_args=["--preemption", "swap"]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=120) as client:
            await client.wait_for_workers(1)
            first = (await client.generate(prompt, GREEDY)).outputs[0]
            before = await client.health()
            again = (await client.generate(prompt, GREEDY)).outputs[0]
            after = await client.health()
            # Found whole: every token but the last, which is computed again for its logits.
            assert after.num_prefix_cache_hits - before.num_prefix_cache_hits == len(prompt) - 1
            assert again.token_ids == first.token_ids
            outputs = await client.generate_batch(others + [prompt], GREEDY)
            health = await wait_until_idle(client)
    assert health.num_preemptions > 0 and health.num_swapped == 0
    expected = hf_greedy(llama_folder, [prompt] + others, GREEDY.max_tokens)
    assert [first.token_ids] + [o.outputs[0].token_ids for o in outputs[:-1]] == expected
    assert outputs[-1].outputs[0].token_ids == expected[0]


async def test_a_burst_sharing_a_long_prefix_computes_it_once_and_matches_transformers(tmp_path):
    """Prompts sent together that share a prefix of MIN_SHARED_TOKENS or more wait for the first
    one's step instead of computing it in the same step: every other prompt finds it whole."""
    llama_folder = make_llama_folder(str(tmp_path / "llama"), max_position_embeddings=512)
    rng = random.Random(11)
    block_size = 16
    shared = [rng.randrange(4, 1000) for _ in range(20 * block_size)]
    assert len(shared) >= MIN_SHARED_TOKENS
    prompts = [shared + [rng.randrange(4, 1000) for _ in range(rng.randrange(3, 12))] for _ in range(8)]
    worker_args = ["--dtype", "float32", "--block-size", str(block_size), "--threads", "1"]
    with LocalCluster(llama_folder, 1, worker_args=worker_args, scheduler_args=["--enable-prefix-caching"]) as cluster:
        async with AsyncClient(cluster.address, timeout_s=120) as client:
            await client.wait_for_workers(1)
            outputs = await client.generate_batch(prompts, GREEDY)
            health = await wait_until_idle(client)
    assert health.num_prefix_cache_hits == (len(prompts) - 1) * len(shared)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(llama_folder, prompts, GREEDY.max_tokens)
