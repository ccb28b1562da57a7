"""Seeded sampling end to end: a request with a seed gets the same tokens alone, in a batch of
hundreds of unseeded sampled requests, after recompute preemptions with two plans in flight
(async scheduling), through `LLM`, the SDK and the HTTP gateway (the `openai` client). The model
has random weights, so at temperature 1 its distribution is nearly flat: equal tokens are the
seed's doing, not a peaked distribution's."""
import asyncio

import openai

from client_sdk import AsyncClient
from stepserve import LLM, SamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import random_prompts

# Float32 and the same block size everywhere: the logits of a request do not depend on the mode.
SHARED = ["--dtype", "float32", "--block-size", "4", "--threads", "1", "--enforce-eager"]
MAX_TOKENS = 12
SEEDED_PROMPTS = random_prompts(6, 1000, lengths=(5, 11), seed=21)


def seeded_params(i: int) -> SamplingParams:
    kinds = [dict(), dict(top_p=0.9), dict(top_k=40, top_p=0.95, temperature=0.8), dict(min_p=0.05)]
    return SamplingParams(**{"temperature": 1.0, **kinds[i % len(kinds)]}, seed=1000 + i, max_tokens=MAX_TOKENS,
                          ignore_eos=True)


SEEDED = [seeded_params(i) for i in range(len(SEEDED_PROMPTS))]


async def alone_and_in_a_crowd(address: str) -> tuple[list[list[int]], list[list[int]], int]:
    """The seeded requests' tokens one at a time, then beside 300 unseeded sampled requests; the
    number of preemptions."""
    async with AsyncClient(address, timeout_s=120) as client:
        await client.wait_for_workers(1)
        alone = [(await client.generate(p, sp)).outputs[0].token_ids for p, sp in zip(SEEDED_PROMPTS, SEEDED)]
        crowd = random_prompts(300, 1000, lengths=(3, 9, 20), seed=22)
        unseeded = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=MAX_TOKENS, ignore_eos=True)
        outputs = await asyncio.gather(client.generate_batch(crowd, unseeded),
                                       client.generate_batch(SEEDED_PROMPTS, SEEDED))
        return alone, [o.outputs[0].token_ids for o in outputs[1]], (await client.health()).num_preemptions


def test_a_seed_gives_the_same_tokens_in_every_situation(llama_folder):
    with LocalCluster(llama_folder, 1, worker_args=[*SHARED, "--num-gpu-blocks", "4000"],
                      scheduler_args=["--no-async-scheduling"]) as cluster:
        alone, in_a_crowd, _ = asyncio.run(alone_and_in_a_crowd(cluster.address))
        assert in_a_crowd == alone
        url = cluster.start_gateway([])
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        model = api.models.list().data[0].id
        for prompt, params, tokens in zip(SEEDED_PROMPTS, SEEDED, alone):
            completion = api.completions.create(
                model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=params.temperature,
                top_p=params.top_p, seed=params.seed,
                extra_body={"top_k": params.top_k, "min_p": params.min_p, "ignore_eos": True,
                            "return_token_ids": True})
            assert completion.choices[0].token_ids == tokens
    assert len({tuple(t) for t in alone}) == len(alone)  # different seeds, different tokens

    # 40 blocks of 4 tokens: the crowd preempts (recompute), two plans are in flight.
    with LocalCluster(llama_folder, 1, worker_args=[*SHARED, "--num-gpu-blocks", "40"],
                      scheduler_args=["--async-scheduling"]) as cluster:
        _, preempted, num_preemptions = asyncio.run(alone_and_in_a_crowd(cluster.address))
        assert num_preemptions > 0, "memory was never short"
        assert preempted == alone

    with LLM(model=llama_folder, dtype="float32", block_size=4, enforce_eager=True, data_parallel_size=1,
             worker_args=["--threads", "1"]) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in SEEDED_PROMPTS], SEEDED)
        assert [o.outputs[0].token_ids for o in outputs] == alone
