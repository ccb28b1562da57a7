"""Test tools for end-to-end tests: real scheduler and worker processes on loopback."""
import asyncio
import random
import socket
import time

from client_sdk.client import AsyncClient

# The compiled step costs seconds of start-up per worker; tests about the service run eagerly,
# and the ones about the model's outputs through the service take COMPILED_WORKER_ARGS.
COMPILED_WORKER_ARGS = ["--dtype", "float32", "--kv-cache-gb", "0.05"]
TEST_WORKER_ARGS = [*COMPILED_WORKER_ARGS, "--enforce-eager"]
# Why the Ray tests skip where they do.
RAY_MISSING = ("Ray is not installed: the Ray tests need the ray extra (pip install -e '.[ray]'; .ci/run installs "
               "it with the test extra)")
# Workers side by side in one test (replicas, restarts): one thread each.
ONE_THREAD_WORKER_ARGS = [*TEST_WORKER_ARGS, "--threads", "1"]


async def wait_until_idle(client: AsyncClient, timeout_s: float = 30.0):
    """Health once nothing waits or runs and every block is back in the pool."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = await client.health()
        idle = (health.num_waiting == 0 and health.num_running == 0 and health.num_swapped == 0
                and health.num_free_blocks == health.num_total_blocks)
        if idle or time.monotonic() > deadline:
            return health
        await asyncio.sleep(0.05)


async def wait_for_waiting(client: AsyncClient, num_waiting: int, timeout_s: float = 60.0):
    """Health once the scheduler holds at least num_waiting waiting requests (sent by another
    task, or by another socket, whose arrival no reply marks)."""
    async with asyncio.timeout(timeout_s):
        while (health := await client.health()).num_waiting < num_waiting:
            await asyncio.sleep(0.02)
    return health


def hf_greedy(folder: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations from Hugging Face transformers, the outside reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # like ignore_eos: never stop, never suppress EOS
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    results: dict[int, list[int]] = {}
    with torch.inference_mode():
        for length, indices in by_len.items():  # equal lengths batch without padding
            for start in range(0, len(indices), 256):
                chunk = indices[start:start + 256]
                ids = torch.tensor([prompts[i] for i in chunk])
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=max_new_tokens, pad_token_id=0)
                for row, i in enumerate(chunk):
                    results[i] = out[row, length:].tolist()
    return [results[i] for i in range(len(prompts))]


async def wait_until_workers_hold_nothing(client: AsyncClient, timeout_s: float = 10.0):
    """Health once the scheduler is idle and the workers' own reports (their heartbeats, which
    lag by up to an interval) say no KV block or state slot is held: nothing leaked."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = await wait_until_idle(client, timeout_s)
        if (health.worker_kv_blocks_in_use == 0 and health.worker_state_slots_in_use == 0) \
                or time.monotonic() > deadline:
            return health
        await asyncio.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_prompts(n: int, vocab_size: int, lengths=(16,), seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab_size) for _ in range(rng.choice(lengths))] for _ in range(n)]
