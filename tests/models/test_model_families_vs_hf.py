"""Llama 3.x, Qwen3, Phi-3 and every rope type: greedy generation equals transformers' generate,
token for token, in float32.

Each folder is built and saved by transformers (random weights) with scaling that changes
positions inside the tests' lengths: original lengths of 16 or 24 tokens for prompts of up to 40
tokens plus 10 generated. In process (the runner under the plan player): the eager path for
every case and the compiled one for the run-time-length rotary paths (Phi-3's longrope with its
recompute, dynamic NTK's per-token frequencies), under plans that mix prefill,
chunked prefill and decode, preempt one request and swap another. Through real scheduler and
worker processes: the scheduler chunks and mixes, and short memory makes it preempt. bfloat16
runs end with the lengths asked for.
"""
import asyncio
import random

import pytest

from client_sdk import AsyncClient, SamplingParams
from protocol.sampling import SamplingParams as WorkerSamplingParams
from stepserve.launcher import LocalCluster
from tests.e2e_helpers import wait_until_idle
from tests.hf_model_folders import make_llama_folder, make_phi3_folder, make_qwen3_folder
from tests.plan_player import PlanPlayer
from tests.runner_greedy import EVENTS, NUM_NEW_TOKENS, hf_greedy_each, runner_greedy, sample_prompts
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
FOLDERS = {
    "llama3": lambda path: make_llama_folder(path, num_key_value_heads=2, max_position_embeddings=64,
                                             rope_parameters=LLAMA3_ROPE),
    "qwen3-yarn": lambda path: make_qwen3_folder(path, max_position_embeddings=64, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}),
    "phi3-longrope": make_phi3_folder,
    "llama-dynamic": lambda path: make_llama_folder(path, num_key_value_heads=2, max_position_embeddings=24,
                                                    rope_parameters={"rope_type": "dynamic", "factor": 3.0,
                                                                     "rope_theta": 10000.0}),
    "llama-linear": lambda path: make_llama_folder(path, rope_parameters={"rope_type": "linear", "factor": 2.5,
                                                                          "rope_theta": 10000.0}),
}
# Compiled: the two rotary paths with run-time lengths (the rope_lengths op; dynamic's per-token
# frequencies in the graph). Fixed-frequency types (llama3, yarn, linear) index precomputed tables
# like default rope, whose compiled path test_models_vs_hf covers (Llama, Qwen3, ...).
COMPILED = ("phi3-longrope", "llama-dynamic")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: make(str(root / name)) for name, make in FOLDERS.items()}


@pytest.fixture(scope="module")
def expected(folders):
    prompts = sample_prompts(1000)
    return prompts, {name: hf_greedy_each(folder, prompts) for name, folder in folders.items()}


@pytest.mark.parametrize("name", list(FOLDERS))
def test_eager_greedy_matches_transformers(folders, expected, name):
    prompts, by_name = expected
    assert runner_greedy(folders[name], prompts, EVENTS, token_budget=16, enforce_eager=True) == by_name[name]


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_greedy_matches_transformers(folders, expected, name):
    prompts, by_name = expected
    assert runner_greedy(folders[name], prompts, EVENTS, token_budget=16) == by_name[name]


@pytest.mark.parametrize("name", list(FOLDERS))
def test_bfloat16_runs_end_with_the_lengths_asked_for(folders, name):
    runner = ModelRunner(RunnerConfig(model=folders[name], dtype="bfloat16", block_size=4, num_gpu_blocks=128,
                                      enforce_eager=True))
    player = PlanPlayer(runner, token_budget=16)
    params = WorkerSamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for i, prompt in enumerate(sample_prompts(1000)):
        player.add(f"req-{i}", prompt, params)
    outputs = player.run()
    assert [len(tokens) for tokens in outputs.values()] == [24] * 4
    assert all(0 <= t < 1000 for tokens in outputs.values() for t in tokens)


# Through the real processes: 24 blocks of 4 tokens hold a few of these requests at a time (the
# scheduler preempts as they grow), a budget of 16 tokens a step chunks the longer prompts.
WORKER_ARGS = ["--dtype", "float32", "--block-size", "4", "--num-gpu-blocks", "24", "--threads", "1"]
SCHEDULER_ARGS = ["--max-num-batched-tokens", "16"]


async def _serve(folder: str, prompts, worker_args) -> tuple[list[list[int]], int]:
    cluster = LocalCluster(folder, 1, worker_args=worker_args, scheduler_args=SCHEDULER_ARGS)
    await asyncio.to_thread(cluster.start)  # in a thread: several clusters start at once
    try:
        async with AsyncClient(cluster.address, timeout_s=300) as client:
            params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS)
            outputs = await client.generate_batch(prompts, params)
            health = await wait_until_idle(client)
    finally:
        cluster.stop()
    return [o.outputs[0].token_ids for o in outputs], health.num_preemptions


def test_real_processes_chunk_preempt_and_match_transformers(folders):
    """Phi-3 on a compiled worker, Qwen3 with yarn and Llama with dynamic NTK on eager ones, the
    three clusters at once (their start-ups overlap)."""
    cases = {"phi3-longrope": WORKER_ARGS, "qwen3-yarn": WORKER_ARGS + ["--enforce-eager"],
             "llama-dynamic": WORKER_ARGS + ["--enforce-eager"]}
    rng = random.Random(5)
    prompts = [[rng.randrange(4, 1000) for _ in range(rng.choice((3, 9, 20, 30)))] for _ in range(8)]
    expected = {name: hf_greedy_each(folders[name], prompts) for name in cases}

    async def serve_all():
        return await asyncio.gather(*(_serve(folders[name], prompts, args) for name, args in cases.items()))

    for name, (outputs, num_preemptions) in zip(cases, asyncio.run(serve_all())):
        assert num_preemptions > 0, f"{name}: memory was never short"
        assert outputs == expected[name], name
